"""What the reconciler asks of SQL to find what a fault left behind (`mxq.workers.repair`).

Each question is one read: jobs queued long enough that their message should be out, running
jobs whose heartbeat went stale, parents whose chunks may all be over, the statuses of the jobs
that hold device leases, the queues live jobs wait in, fires whose tick died. The reconciler
acts on the answers through `mxq.db.jobs`'s guarded transitions, so a job that moved on between
the read and the action is left alone.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from mxq.db.engine import session_scope
from mxq.db.jobs import ROUTE, heartbeat_stale, route_of
from mxq.db.records import JobRoute, LostFire
from mxq.db.schema import Fire, Job, Schedule
from mxq.status import JobStatus


def queued_before(url: str, cutoff: datetime) -> dict[int, JobRoute]:
    """The jobs queued since before `cutoff` and not held for admission, by id: past it, a job's
    message should be out."""
    with session_scope(url) as session:
        rows = session.execute(select(Job.id, *ROUTE)
                               .where(Job.status == JobStatus.QUEUED, Job.held.is_(False),
                                      Job.submitted_at < cutoff))
        return {r.id: route_of(r) for r in rows}


def stale_running(url: str, cutoff: datetime) -> dict[int, JobRoute]:
    """The running jobs (parents apart: their chunks run them) with no heartbeat since `cutoff`."""
    with session_scope(url) as session:
        rows = session.execute(select(Job.id, *ROUTE).where(
            Job.status == JobStatus.RUNNING, Job.chunks.is_(None), heartbeat_stale(cutoff)))
        return {r.id: route_of(r) for r in rows}


def running_parents(url: str) -> list[int]:
    """The running jobs that were split into chunks: each is closed once all its chunks end."""
    with session_scope(url) as session:
        return list(session.scalars(select(Job.id).where(Job.status == JobStatus.RUNNING,
                                                         Job.chunks.is_not(None))))


def statuses(url: str, ids: set[int]) -> dict[int, str]:
    """The status of each of `ids` that is a job (an id that is none is left out): which are
    still queued, which are over, which hold leases."""
    if not ids:
        return {}
    with session_scope(url) as session:
        return {int(i): str(status) for i, status in
                session.execute(select(Job.id, Job.status).where(Job.id.in_(ids)))}


def live_queues(url: str) -> set[str]:
    """The queues of every queued or running job (a job's worker may be gone, its queue not)."""
    with session_scope(url) as session:
        return set(session.scalars(select(Job.queue).distinct().where(
            Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))))


def lost_fires(url: str, cutoff: datetime) -> list[LostFire]:
    """The fires made before `cutoff` that have neither a job nor an error: their tick died
    between recording the fire and submitting its job."""
    with session_scope(url) as session:
        rows = session.execute(select(Fire.id, Schedule.name).join(Schedule)
                               .where(Fire.job_id.is_(None), Fire.error.is_(None), Fire.scored.is_(None),
                                      Fire.fired_at < cutoff)).all()
        return [{"fire_id": int(fire_id), "schedule": str(name)} for fire_id, name in rows]
