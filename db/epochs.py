"""Per-epoch training records, keyed by (job, epoch) so a resumed job rewrites, never doubles."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, select, update

from db.engine import session_scope
from db.retry import db_retry
from db.schema import Epoch, Job, iso


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
