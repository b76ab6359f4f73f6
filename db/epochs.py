"""Per-epoch training records, keyed by (job, epoch) so a resumed job rewrites, never doubles."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from mxq.db.engine import session_scope
from mxq.db.retry import db_retry
from mxq.db.schema import Epoch, Job, iso


@db_retry
def record(url: str, job_id: int, values: dict[str, Any]) -> None:
    with session_scope(url) as s:
        s.execute(delete(Epoch).where(Epoch.job_id == job_id, Epoch.epoch == values["epoch"]))
        s.execute(insert(Epoch).values(job_id=job_id, **values))


def list_epochs(url: str, job_id: int) -> list[dict[str, Any]]:
    with session_scope(url) as s:
        rows = s.scalars(select(Epoch).where(Epoch.job_id == job_id).order_by(Epoch.epoch))
        return [{"epoch": e.epoch, "train_loss": e.train_loss, "train_accuracy": e.train_accuracy,
                 "val_accuracy": e.val_accuracy, "seconds": e.seconds,
                 "samples_per_sec": e.samples_per_sec, "per_device": e.per_device,
                 "checkpoint": e.checkpoint, "at": iso(e.at)} for e in rows]


@db_retry
def set_devices(url: str, job_id: int, devices: list[str]) -> None:
    with session_scope(url) as s:
        s.execute(update(Job).where(Job.id == job_id).values(devices=devices))


def merge_parts(url: str, parent_id: int) -> None:
    """A multi-node training's epochs from its parts' (each part records its own node's): the
    mean loss and accuracy, the slowest node's seconds, samples/s summed, every node's devices
    in `per_device` (labelled `cpu:0@node`). Epochs some part has not finished yet wait for a
    later call; two parts merging the same epoch at once write it once."""
    try:
        _merge(url, parent_id)
    except IntegrityError:
        pass  # another part merged the same epoch meanwhile, from the same rows


@db_retry
def _merge(url: str, parent_id: int) -> None:
    with session_scope(url) as s:
        parts = list(s.scalars(select(Job.id).where(Job.parent_id == parent_id)))
        rows: dict[int, list[Epoch]] = {}
        for e in s.scalars(select(Epoch).where(Epoch.job_id.in_(parts))):
            rows.setdefault(e.epoch, []).append(e)
        merged = set(s.scalars(select(Epoch.epoch).where(Epoch.job_id == parent_id)))
        for n in sorted(n for n, es in rows.items() if len(es) == len(parts) and n not in merged):
            es = rows[n]
            vals = [e.val_accuracy for e in es if e.val_accuracy is not None]
            values = {"epoch": n, "train_loss": sum(e.train_loss for e in es) / len(es),
                      "train_accuracy": sum(e.train_accuracy for e in es) / len(es),
                      "val_accuracy": sum(vals) / len(vals) if vals else None,
                      "seconds": max(e.seconds for e in es),
                      "samples_per_sec": sum(e.samples_per_sec for e in es),
                      "per_device": {k: v for e in es for k, v in (e.per_device or {}).items()},
                      "checkpoint": next((e.checkpoint for e in es if e.checkpoint), None)}
            s.execute(insert(Epoch).values(job_id=parent_id, **values))
