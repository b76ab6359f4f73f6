"""Per-epoch training records, keyed by (job, epoch) so a resumed job rewrites, never doubles."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from mxq import parts as part_rules
from mxq.db.engine import session_scope
from mxq.db.fence import Fence, still_ours
from mxq.db.records import EpochRecord
from mxq.db.retry import db_retry
from mxq.db.schema import Epoch, Job, iso


@db_retry
def record(url: str, job_id: int, values: dict[str, Any], fence: Fence | None = None) -> bool:
    """Store an epoch (with `fence`, only while the job is that attempt's: False otherwise)."""
    with session_scope(url) as session:
        if fence is not None and not still_ours(session, fence):
            return False
        session.execute(delete(Epoch).where(Epoch.job_id == job_id, Epoch.epoch == values["epoch"]))
        session.execute(insert(Epoch).values(job_id=job_id, **values))
    return True


def list_epochs(url: str, job_id: int) -> list[EpochRecord]:
    with session_scope(url) as session:
        rows = session.scalars(select(Epoch).where(Epoch.job_id == job_id).order_by(Epoch.epoch))
        return [{"epoch": e.epoch, "train_loss": e.train_loss, "train_accuracy": e.train_accuracy,
                 "val_accuracy": e.val_accuracy, "seconds": e.seconds,
                 "samples_per_sec": e.samples_per_sec, "per_device": e.per_device,
                 "checkpoint": e.checkpoint, "at": iso(e.at)} for e in rows]


@db_retry
def set_devices(url: str, job_id: int, devices: list[str]) -> None:
    with session_scope(url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(devices=devices))


def merge_parts(url: str, parent_id: int) -> None:
    """Store a multi-node training's merged epochs (`mxq.parts.merge_epochs`) once every part has them; two
    parts merging the same epoch at once write it once."""
    try:
        _merge(url, parent_id)
    except IntegrityError:
        pass  # another part merged the same epoch meanwhile, from the same rows


@db_retry
def _merge(url: str, parent_id: int) -> None:
    with session_scope(url) as session:
        parts = list(session.scalars(select(Job.id).where(Job.parent_id == parent_id)))
        by_epoch: dict[int, list[Epoch]] = {}
        for e in session.scalars(select(Epoch).where(Epoch.job_id.in_(parts))):
            by_epoch.setdefault(e.epoch, []).append(e)
        merged = set(session.scalars(select(Epoch.epoch).where(Epoch.job_id == parent_id)))
        for n in part_rules.epochs_ready(by_epoch, len(parts), merged):
            session.execute(insert(Epoch).values(job_id=parent_id, **part_rules.merge_epochs(n, by_epoch[n])))
