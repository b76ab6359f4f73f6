"""What the dependency pass (`mxq.workers.jobs.dependencies`, `--after`) reads and writes in
SQL: the jobs that wait for others, the outcomes and owners of the jobs they wait for, and the
two ends of a wait, each one guarded UPDATE so that two passes at once (a job's end, a submit,
the reconciler) decide each job once.

A waiting job is `held` and `awaiting`: admission (`admission.held`) never sees it, the
reconciler never publishes it, its owner's use counts nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, select, update

from mxq.db.engine import session_scope
from mxq.db.jobs import ROUTE, route_of
from mxq.db.records import JobRoute
from mxq.db.retry import db_retry
from mxq.db.schema import Job, utcnow
from mxq.db.webhooks.outbox import job_ended
from mxq.status import JobStatus

Outcome = tuple[str, str | None]  # a job's status and error


def _waiting() -> tuple[ColumnElement[bool], ...]:
    return (Job.awaiting.is_(True), Job.status == JobStatus.QUEUED)


@db_retry
def awaiting(url: str, limit: int) -> list[tuple[int, list[int]]]:
    """The first `limit` jobs waiting for others, oldest first (a job waits only for older ones,
    so a chain is decided in one pass): (id, the ids it waits for)."""
    with session_scope(url) as session:
        return [(i, list(after or [])) for i, after in session.execute(
            select(Job.id, Job.after).where(*_waiting()).order_by(Job.id).limit(limit))]


@db_retry
def outcomes(url: str, ids: Iterable[int]) -> dict[int, Outcome]:
    """Each job's (status, error); a job that is not there is missing."""
    wanted = sorted(set(ids))
    with session_scope(url) as session:
        return {i: (status, error) for i, status, error in session.execute(
            select(Job.id, Job.status, Job.error).where(Job.id.in_(wanted)))}


@db_retry
def owners(url: str, ids: Iterable[int]) -> dict[int, tuple[str | None, str | None]]:
    """Each job's owner and team (who may read it); a job that is not there is missing."""
    wanted = sorted(set(ids))
    with session_scope(url) as session:
        return {i: (owner, team) for i, owner, team in session.execute(
            select(Job.id, Job.owner, Job.team).where(Job.id.in_(wanted)))}


@db_retry
def fail(url: str, job_id: int, error: str) -> bool:
    """Fail a job still waiting (one it waits for can never succeed), its `job.failed` webhook
    in the same transaction, as every other failure's; False when it is not waiting any more
    (cancelled, or another pass decided it)."""
    with session_scope(url) as session:
        failed = session.execute(update(Job).where(Job.id == job_id, *_waiting()).values(
            status=JobStatus.FAILED, finished_at=utcnow(), error=error, awaiting=False,
            held=False).returning(Job.id)).one_or_none() is not None
        if failed:
            job_ended(session, [job_id])
        return failed


@db_retry
def met(url: str, job_id: int, release: bool) -> JobRoute | None:
    """A job whose waits are over: no longer awaiting and, with `release` (admission is off),
    no longer held either; its route for the one caller whose UPDATE did it (None: another
    pass did, or it was cancelled). Without `release`, the admitter releases it in its turn."""
    with session_scope(url) as session:
        row = session.execute(update(Job).where(Job.id == job_id, *_waiting())
                              .values(awaiting=False, **({"held": False} if release else {}))
                              .returning(*ROUTE)).one_or_none()
    return None if row is None else route_of(row)
