"""The model registry: named, versioned models and which version is promoted."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mxq import engines
from mxq.db.engine import session_scope
from mxq.db.fence import Fence, Superseded, still_ours
from mxq.db.records import ModelRecord
from mxq.db.schema import Model, iso
from mxq.errors import Conflict, NotFound
from mxq.preprocess import Preprocess


class ModelNotFound(NotFound):
    """No such model or version; the message lists what exists."""


class ModelConflict(Conflict):
    """The version being added was taken by a concurrent add of the same name."""


def model_record(m: Model) -> ModelRecord:
    return {
        "name": m.name, "version": m.version, "arch": m.arch, "input_shape": list(m.input_shape),
        "classes": m.classes, "params_file": m.params_file, "symbol_file": m.symbol_file,
        "checksum": m.checksum, "created_at": iso(m.created_at),
        "source": m.source, "promoted": m.promoted, "metrics": m.metrics,
        "onnx": m.onnx, "engines": m.engines or {}, "auto_engine": _auto_engines(m),
        "preprocess": Preprocess.from_dict(m.preprocess).as_dict(),
        "outputs": m.outputs or "logits",
        "variants": m.variants or {},
    }


def _auto_engines(m: Model) -> dict[str, dict[str, str]]:
    """What `--engine auto` runs per device kind measured so far, and why (`mxq.engines`)."""
    return {kind: asdict(engines.choose("auto", m.onnx, speeds))
            for kind, speeds in (m.engines or {}).items()}


def next_version(url: str, name: str) -> int:
    with session_scope(url) as session:
        return (session.scalar(select(func.max(Model.version)).where(Model.name == name)) or 0) + 1


def add_model(url: str, record: dict[str, Any], fence: Fence | None = None) -> ModelRecord:
    """Insert a version (the record names it); a clash with a concurrent add is an error.

    A training's version (`fence` given) is added only while the job is that attempt's
    (`Superseded` otherwise), and once per job: a later attempt of a training that registered
    already gets that version back, never a second one."""
    try:
        with session_scope(url) as session:
            if fence is not None:
                done = session.scalar(select(Model).where(Model.source == record["source"]))
                if done is not None:
                    return model_record(done)
                if not still_ours(session, fence):
                    raise Superseded(f"job {fence.job_id} is no longer attempt {fence.attempt}'s: "
                                     "its model was not registered")
            model = Model(**record)
            session.add(model)
            session.flush()
            return model_record(model)
    except IntegrityError:
        raise ModelConflict(f"model {record['name']} version {record['version']} was added "
                            "concurrently; add it again") from None


def resolve(url: str, name: str, version: int | None = None) -> ModelRecord:
    """A given version, else the promoted one, else the newest."""
    with session_scope(url) as session:
        versions = list(session.scalars(select(Model).where(Model.name == name).order_by(Model.version)))
        if not versions:
            known = sorted(set(session.scalars(select(Model.name))))
            raise ModelNotFound(f"unknown model {name!r}; known models: "
                                f"{', '.join(known) or 'none (add one with `mxq models add`)'}")
        if version is None:
            promoted = [m for m in versions if m.promoted]
            return model_record(promoted[-1] if promoted else versions[-1])
        for m in versions:
            if m.version == version:
                return model_record(m)
        raise ModelNotFound(f"model {name!r} has no version {version}; versions: "
                            f"{', '.join(str(m.version) for m in versions)}")


def list_models(url: str, name: str | None = None) -> list[ModelRecord]:
    q = select(Model).order_by(Model.name, Model.version)
    if name is not None:
        q = q.where(Model.name == name)
    with session_scope(url) as session:
        return [model_record(m) for m in session.scalars(q)]


def promote(url: str, name: str, version: int) -> ModelRecord:
    resolve(url, name, version)  # raises with the versions that exist
    with session_scope(url) as session:
        session.execute(update(Model).where(Model.name == name).values(promoted=Model.version == version))
    return resolve(url, name, version)


def _locked(session: Session, name: str, version: int) -> Model:
    """A version's row, locked for the rest of the transaction (a read-modify-write of JSON)."""
    model = session.scalar(select(Model).where(Model.name == name, Model.version == version)
                           .with_for_update())
    if model is None:
        raise ModelNotFound(f"model {name!r} has no version {version}")
    return model


def record_engine_speeds(url: str, name: str, version: int, kind: str,
                         speeds: dict[str, float]) -> dict[str, dict[str, float]]:
    """Store each engine's measured samples/s for `kind` devices; return all kinds' figures."""
    with session_scope(url) as session:
        model = _locked(session, name, version)
        model.engines = {**(model.engines or {}), kind: speeds}
        return dict(model.engines)


def record_variant(url: str, name: str, version: int, precision: str,
                   variant: dict[str, Any]) -> ModelRecord:
    """Store a version's `precision` build and its checks (`mxq models quantize`), replacing an
    earlier one; the earlier build's measured speeds go with it, so `--precision auto` measures
    the new one before it serves."""
    with session_scope(url) as session:
        model = _locked(session, name, version)
        model.variants = {**(model.variants or {}), precision: variant}
        model.engines = {kind: {k: v for k, v in speeds.items() if k != precision}
                         for kind, speeds in (model.engines or {}).items()}
        session.flush()
        return model_record(model)
