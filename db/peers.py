"""The parts of a multi-node training as their peers see them: read together, a part that
stalled or never started failed by a peer, and whether a part runs for the first time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update

from mxq.db.engine import rowcount, session_scope
from mxq.db.jobs import claimable
from mxq.db.retry import db_retry
from mxq.db.schema import Job, as_utc, utcnow
from mxq.status import JobStatus


def attempts(url: str, job_id: int) -> int:
    """How many times the job was claimed (a redelivered part: more than once)."""
    with session_scope(url) as session:
        return session.scalar(select(Job.attempts).where(Job.id == job_id)) or 0


@dataclass
class PartRow:
    id: int
    index: int
    node: str
    status: str
    attempts: int
    heartbeat_at: datetime | None
    error: str | None
    worker: str | None
    cancel: bool


def parts_of(url: str, parent: int) -> list[PartRow]:
    with session_scope(url) as session:
        rows = session.scalars(select(Job).where(Job.parent_id == parent).order_by(Job.chunk_index))
        return [PartRow(j.id, j.chunk_index or 0, str((j.params.get("dist") or {}).get("node", j.node)),
                        j.status, j.attempts, as_utc(j.heartbeat_at), j.error, j.worker,
                        j.cancel_requested_at is not None) for j in rows]


@db_retry
def fail_part(url: str, job_id: int, error: str, stale_before: datetime) -> bool:
    """Fail a part that is queued, or running with no heartbeat since `stale_before` (a requeued
    part keeps `running` with no heartbeat until a worker claims it again)."""
    with session_scope(url) as session:
        return bool(rowcount(session.execute(
            update(Job).where(Job.id == job_id, claimable(stale_before))
            .values(status=JobStatus.FAILED, finished_at=utcnow(), error=error, heartbeat_at=None)
        )))
