"""The model registry: named, versioned models and which version is promoted; the
architectures' code users registered (`archs`: `mxq arch add`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, cast

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mxq import engines
from mxq.db.engine import rowcount, session_scope
from mxq.db.fence import Fence, Superseded, still_ours
from mxq.db.records import ArchRecord, Head, ModelRecord
from mxq.db.schema import Arch, Job, Model, iso
from mxq.db.sharing.teams import check_team, rights_of
from mxq.db.webhooks import outbox
from mxq.errors import Conflict, Forbidden, NotFound
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
        "heads": cast(list[Head] | None, m.heads),
        "owner": m.owner,
        "team": m.team,
        "removed_at": iso(m.removed_at),
    }


def _auto_engines(m: Model) -> dict[str, dict[str, str]]:
    """What `--engine auto` runs per device kind measured so far, and why (`mxq.engines`)."""
    return {kind: asdict(engines.choose("auto", m.onnx, speeds))
            for kind, speeds in (m.engines or {}).items()}


def next_version(url: str, name: str) -> int:
    with session_scope(url) as session:
        return (session.scalar(select(func.max(Model.version)).where(Model.name == name)) or 0) + 1


def ownership(url: str, name: str) -> tuple[str | None, str | None] | None:
    """(owner, team) of model `name`: who may register and promote its versions; None for a
    name no version has yet."""
    with session_scope(url) as session:
        latest = session.scalar(select(Model).where(Model.name == name)
                                .order_by(Model.version.desc()).limit(1))
        return None if latest is None else (latest.owner, latest.team)


def share(url: str, name: str, owner: str | None, team: str | None,
          no_team: bool = False) -> tuple[str | None, str | None]:
    """Set model `name`'s owner (a current user) and team (an existing one) on every version;
    what was not given stays. The new (owner, team)."""
    resolve(url, name)  # 404 naming the models there are
    if owner is not None and rights_of(url, owner).role is None:
        raise NotFound(f"unknown user {owner!r}")
    if team is not None:
        check_team(url, team, "local:admin")
    with session_scope(url) as session:
        values: dict[str, object] = {}
        if owner is not None:
            values["owner"] = owner
        if team is not None or no_team:
            values["team"] = team
        session.execute(update(Model).where(Model.name == name).values(**values))
    owned = ownership(url, name)
    assert owned is not None
    return owned


def check_registrant(url: str, name: str, registrant: str) -> None:
    """Forbidden unless `registrant` (a stored owner) may add a version of model `name` now: a
    new name is anyone's who may submit; an existing one its owner's, its team's and admins'."""
    owned = ownership(url, name)
    if owned is not None and not rights_of(url, registrant).may_manage_model(*owned):
        raise Forbidden(f"{registrant!r} may not register or promote versions of model {name!r}, "
                        f"which {owned[0] or 'the admins'} own{'s' if owned[0] else ''}"
                        f"{f' with team {owned[1]!r}' if owned[1] else ''}")


def _registrant(url: str, record: dict[str, Any], fence: Fence | None) -> dict[str, Any]:
    """The record with its owner and team: an existing model's own, else (a new name) the
    training job's, or what the record says (the CLI's local owner). A training's registrant
    is checked again here, not only at submit: its rights may have changed since."""
    if fence is not None:
        with session_scope(url) as session:
            job = session.get(Job, fence.job_id)
            who = (job.owner, job.team) if job is not None else (None, None)
        if who[0] is not None:
            check_registrant(url, record["name"], who[0])
        record = {**record, "owner": who[0], "team": who[1]}
    owned = ownership(url, record["name"])
    return record if owned is None else {**record, "owner": owned[0], "team": owned[1]}


def add_model(url: str, record: dict[str, Any], fence: Fence | None = None) -> ModelRecord:
    """Insert a version (the record names it); a clash with a concurrent add is an error.

    A training's version (`fence` given) is added only while the job is that attempt's
    (`Superseded` otherwise), once per job (a later attempt of a training that registered
    already gets that version back, never a second one), and only while the job's owner may
    register versions of that model (`check_registrant`)."""
    record = _registrant(url, record, fence)
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
            outbox.emit(session, "version.registered", {"model": _version_data(model)})
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
        kept = [m for m in versions if m.removed_at is None]
        if version is None:
            promoted = [m for m in kept if m.promoted]
            return model_record(promoted[-1] if promoted else (kept or versions)[-1])
        return model_record(_version_of(name, version, versions, kept))


def _version_of(name: str, version: int, versions: list[Model], kept: list[Model]) -> Model:
    """Version `version` of the model's `versions`, unless the retention policy removed it
    (ModelNotFound, naming the versions `kept`, or those that exist)."""
    for m in versions:
        if m.version == version and m.removed_at is None:
            return m
        if m.version == version:
            raise ModelNotFound(f"model {name!r} version {version} was removed by the "
                                f"retention policy on {iso(m.removed_at)} (MXQ_KEEP_VERSIONS); "
                                f"versions kept: {', '.join(str(k.version) for k in kept)}")
    raise ModelNotFound(f"model {name!r} has no version {version}; versions: "
                        f"{', '.join(str(m.version) for m in versions)}")


def list_models(url: str, name: str | None = None) -> list[ModelRecord]:
    q = select(Model).order_by(Model.name, Model.version)
    if name is not None:
        q = q.where(Model.name == name)
    with session_scope(url) as session:
        return [model_record(m) for m in session.scalars(q)]


def promote(url: str, name: str, version: int) -> ModelRecord:
    """Make `version` the one inference uses by default (who may is checked by the caller:
    the API's route, a schedule's fire by its owner's rights)."""
    resolve(url, name, version)  # raises with the versions that exist
    with session_scope(url) as session:
        before = list(session.scalars(select(Model.version).where(Model.name == name, Model.promoted)))
        session.execute(update(Model).where(Model.name == name).values(promoted=Model.version == version))
        if before != [version]:  # a promotion, not the promoted version named again
            model = session.scalars(select(Model).where(Model.name == name,
                                                        Model.version == version)).one()
            outbox.emit(session, "version.promoted",
                        {"model": _version_data(model), "previous_version": max(before, default=None)})
    return resolve(url, name, version)


def _version_data(m: Model) -> dict[str, Any]:
    """What a version event says of the version."""
    return {"name": m.name, "version": m.version, "arch": m.arch, "source": m.source,
            "outputs": m.outputs, "classes": m.classes, "metrics": m.metrics, "owner": m.owner,
            "team": m.team, "created_at": iso(m.created_at)}


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


class ArchNotFound(NotFound):
    """No architecture of that name registered (`mxq arch ls`)."""


def arch_record(a: Arch) -> ArchRecord:
    return {"name": a.name, "version": a.version, "sha256": a.sha256, "factory": a.factory,
            "file_name": a.file_name, "classes": a.classes, "input_shape": list(a.input_shape),
            "added_by": a.added_by, "added_at": iso(a.added_at)}


def add_arch(url: str, record: dict[str, Any]) -> ArchRecord:
    """The next version of an architecture's name (its first: 1); the same code and factory as
    its newest version is that version, not another."""
    with session_scope(url) as session:
        newest = session.scalars(select(Arch).where(Arch.name == record["name"])
                                 .order_by(Arch.version.desc())).first()
        if newest is not None and (newest.sha256, newest.factory) == (record["sha256"],
                                                                      record["factory"]):
            return arch_record(newest)
        arch = Arch(**record, version=1 if newest is None else newest.version + 1)
        session.add(arch)
        try:
            session.flush()
        except IntegrityError:
            raise Conflict(f"arch {record['name']} was added concurrently; add it again") from None
        return arch_record(arch)


def list_archs(url: str, name: str | None = None) -> list[ArchRecord]:
    """Every version of every registered architecture (of `name`), by name and version."""
    with session_scope(url) as session:
        query = select(Arch).order_by(Arch.name, Arch.version)
        if name is not None:
            query = query.where(Arch.name == name)
        return [arch_record(a) for a in session.scalars(query)]


def find_arch(url: str, name: str) -> ArchRecord | None:
    """The newest version of architecture `name`: the one a training of it pins."""
    versions = list_archs(url, name)
    return versions[-1] if versions else None


def remove_arch(url: str, name: str) -> int:
    """Forget every version of architecture `name` (the stored files stay: a training that
    pinned one still reads it); how many were removed, ArchNotFound for none."""
    with session_scope(url) as session:
        removed = rowcount(session.execute(delete(Arch).where(Arch.name == name)))
    if not removed:
        raise ArchNotFound(f"no architecture {name!r} is registered (see `mxq arch ls`)")
    return removed
