"""What admission reads and writes in SQL: the owners' shares and quotas, the held jobs, what
each owner uses, and the release of a held job to the broker (`mxq.workers.jobs.admit`).

SQL is the source of truth: a job is `held` until one UPDATE releases it, and only the process
whose UPDATE did publishes it; a release whose publish is lost is a queued job without its
message, which the reconciler publishes as any other.
"""

from __future__ import annotations

import statistics
from datetime import datetime

from sqlalchemy import func, or_, select, update

from mxq.db.engine import session_scope
from mxq.db.jobs import ROUTE, route_of
from mxq.db.records import JobRoute
from mxq.db.reports.queue import NEXT_FIRST
from mxq.db.retry import db_retry
from mxq.db.schema import Job, User, as_utc, utcnow
from mxq.shares import Held, Share, Usage, devices_needed
from mxq.status import JobStatus

NO_OWNER = "-"  # jobs from before owners


def _needs(job: Job) -> int:
    return devices_needed(job.kind, job.params)


@db_retry
def active(url: str) -> bool:
    """Whether any current user has a share other than 1 or a quota: only then are jobs held."""
    with session_scope(url) as session:
        return bool(session.scalar(select(func.count()).select_from(User).where(
            or_(User.share != 1.0, User.max_devices.is_not(None)), User.removed_at.is_(None))))


@db_retry
def share_of(url: str, owner: str) -> Share:
    """One owner's share and quota (weight 1 and none for an owner that is no current user)."""
    with session_scope(url) as session:
        row = session.get(User, owner)
        if row is None or row.removed_at is not None:
            return Share()
        return Share(row.share, row.max_devices)


@db_retry
def shares(url: str) -> dict[str, Share]:
    with session_scope(url) as session:
        return {u.name: Share(u.share, u.max_devices) for u in session.scalars(select(User))}


@db_retry
def held(url: str, limit: int) -> list[Held]:
    """The first `limit` held jobs, in the order workers would take them; not those waiting for
    other jobs (`--after`: `dependencies.py`), which neither take a turn nor count as waiting."""
    with session_scope(url) as session:
        rows = session.scalars(select(Job).where(Job.status == JobStatus.QUEUED, Job.held.is_(True),
                                                 Job.awaiting.is_(False))
                               .order_by(*NEXT_FIRST).limit(limit))
        return [Held(j.id, j.owner or NO_OWNER, j.priority, _needs(j), j.queue, j.attempts > 0)
                for j in rows]


def _device_seconds(job: Job, since: datetime, now: datetime) -> float:
    start = max(as_utc(job.started_at) or now, since)
    end = as_utc(job.finished_at) or now
    return max(0.0, (end - start).total_seconds()) * len(job.devices or [None])


@db_retry
def usage(url: str, since: datetime) -> Usage:
    """Each owner's device-seconds since `since`, and the devices it holds now: its running jobs',
    and what its admitted jobs waiting for a worker will take."""
    now = utcnow()
    with session_scope(url) as session:
        recent = list(session.scalars(select(Job).where(
            Job.chunks.is_(None), or_(Job.status == JobStatus.RUNNING, Job.finished_at >= since),
            Job.started_at.is_not(None))))
        busy = list(session.scalars(select(Job).where(
            Job.chunks.is_(None), Job.held.is_(False),
            Job.status.in_([JobStatus.RUNNING, JobStatus.QUEUED]))))
    seconds: dict[str, float] = {}
    for job in recent:
        owner = job.owner or NO_OWNER
        seconds[owner] = seconds.get(owner, 0.0) + _device_seconds(job, since, now)
    devices: dict[str, int] = {}
    for job in busy:
        owner = job.owner or NO_OWNER
        devices[owner] = devices.get(owner, 0) + _needs(job)
    ended = [_device_seconds(j, since, now) for j in recent if j.finished_at is not None]
    return Usage(seconds, devices, statistics.median(ended) if ended else 1.0)


@db_retry
def admitted_waiting(url: str) -> dict[str, int]:
    """queue -> jobs released to the broker and not yet taken by a worker."""
    with session_scope(url) as session:
        return {q: int(n) for q, n in session.execute(
            select(Job.queue, func.count()).where(Job.status == JobStatus.QUEUED, Job.held.is_(False),
                                                  Job.chunks.is_(None)).group_by(Job.queue))}


@db_retry
def release(url: str, job_id: int, borrowed: bool = False) -> JobRoute | None:
    """Hand the held job to the broker (`borrowed`: beyond its owner's quota, so preemptible):
    its route, for the one caller whose UPDATE released it."""
    borrowing = {"borrowed": True, "preemptible": True} if borrowed else {}
    with session_scope(url) as session:
        row = session.execute(update(Job).where(Job.id == job_id, Job.held.is_(True),
                                                Job.awaiting.is_(False), Job.status == JobStatus.QUEUED)
                              .values(held=False, **borrowing)
                              .returning(*ROUTE)).one_or_none()
    return None if row is None else route_of(row)
