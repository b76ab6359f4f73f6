"""What preemption reads and writes in SQL: the running jobs as `mxq.priorities.victim` judges
them, the queued jobs that may ask one to yield, and the request itself.

A request only marks the running job (`preempt_for`); its attempt yields at its next checkpoint
(`yield_target`, `yielded`), so nothing is stopped from outside and what it committed is never
lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import case, select, update

from mxq.db.engine import rowcount, session_scope
from mxq.db.fence import Fence
from mxq.db.retry import db_retry
from mxq.db.schema import Job, as_utc, utcnow
from mxq.priorities import HIGH, LOW, Running
from mxq.status import JobStatus


@dataclass(frozen=True)
class Queued:
    """A queued job that may preempt: its level and the queue its message waits in."""

    id: int
    level: str
    queue: str
    needs: int  # devices at once
    borrowed: bool  # admitted beyond its owner's quota


def _devices(job: Job) -> frozenset[str]:
    """The `node/device` labels a running job holds (a training all of its devices)."""
    held = job.devices or ([job.device] if job.device else [])
    return frozenset(f"{job.node}/{d}" for d in held)


@db_retry
def running(url: str, ttl: float) -> list[Running]:
    """The jobs running now with a live heartbeat (parents of chunks apart: their chunks run)."""
    cutoff = utcnow() - timedelta(seconds=ttl)
    with session_scope(url) as session:
        rows = session.scalars(select(Job).where(Job.status == JobStatus.RUNNING,
                                                 Job.chunks.is_(None), Job.heartbeat_at >= cutoff))
        return [Running(id=j.id, level=j.priority, preemptible=j.preemptible, devices=_devices(j),
                        started_at=as_utc(j.started_at) or utcnow(), preemptions=j.preemptions,
                        preempted_by=tuple(j.preempted_by or ()), yielding_to=j.preempt_for,
                        parts=bool(j.params.get("dist")), borrowed=j.borrowed) for j in rows]


@db_retry
def waiting(url: str, limit: int, low: bool = False, ids: list[int] | None = None) -> list[Queued]:
    """The queued jobs above the lowest level (with `low`, of every level: one may take back a
    borrowed device; with `ids`, of those only), highest first, then oldest: those that may ask
    a running job to yield."""
    where = [] if low else [Job.priority != LOW]
    if ids is not None:
        where.append(Job.id.in_(ids))
    with session_scope(url) as session:
        rows = session.execute(select(Job.id, Job.priority, Job.queue, Job.params, Job.borrowed)
                               .where(Job.status == JobStatus.QUEUED, *where,
                                      Job.chunks.is_(None), Job.held.is_(False))
                               .order_by(case((Job.priority == HIGH, 0), else_=1), Job.id)
                               .limit(limit))
        return [Queued(r.id, r.priority, r.queue, int(r.params.get("devices") or 1), r.borrowed)
                for r in rows]


@db_retry
def ask_to_yield(url: str, victim: int, waiting_id: int) -> bool:
    """Mark `victim` to yield to `waiting_id` at its next checkpoint, unless it already yields to
    another job or stopped running meanwhile."""
    with session_scope(url) as session:
        return bool(rowcount(session.execute(
            update(Job).where(Job.id == victim, Job.status == JobStatus.RUNNING,
                              Job.preempt_for.is_(None))
            .values(preempt_for=waiting_id))))


@db_retry
def yield_target(url: str, fence: Fence) -> int | None:
    """The waiting job this attempt was asked to yield to, while that job still waits; a request
    whose job no longer waits (another device took it, it was cancelled) is dropped: None."""
    with session_scope(url) as session:
        target = session.scalar(select(Job.preempt_for).where(*fence.holds()))
        if target is None:
            return None
        if session.scalar(select(Job.status).where(Job.id == target)) == JobStatus.QUEUED:
            return int(target)
        session.execute(update(Job).where(*fence.holds()).values(preempt_for=None))
        return None


@db_retry
def yielded(url: str, fence: Fence, to: int) -> bool:
    """The attempt stopped at a checkpoint for job `to`: the job is queued again (its attempt not
    counted, what it committed kept), and `to` is recorded so it never preempts it again."""
    with session_scope(url) as session:
        before = session.scalar(select(Job.preempted_by).where(*fence.holds()))
        return bool(rowcount(session.execute(
            update(Job).where(*fence.holds())
            .values(status=JobStatus.QUEUED, heartbeat_at=None, preempt_for=None,
                    preemptions=Job.preemptions + 1, preempted_by=[*(before or []), to]))))
