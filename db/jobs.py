"""A job's life in SQL. Status moves forward, queued -> running -> succeeded|failed|cancelled,
but for a preempted job, which goes back from running to queued (`mxq.db.sharing.preemption.yielded`).

Every transition is one UPDATE guarded by the statuses it may leave from, so two workers (or a
redelivered message) can never both move the same job.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
from sqlalchemy import (
    ColumnElement,
    Row,
    and_,
    exists,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from mxq.db import events
from mxq.db.chunks import settle_parent
from mxq.db.engine import rowcount, session_scope
from mxq.db.fence import Fence, still_ours
from mxq.db.fence import RunCheck as RunCheck  # re-exported: what a running attempt does next
from mxq.db.records import JobRoute, JobRow
from mxq.db.retry import db_retry
from mxq.db.schema import Job, JobMetric, as_utc, utcnow
from mxq.db.webhooks.outbox import job_ended
from mxq.errors import Conflict
from mxq.priorities import Priority
from mxq.status import FINISHED, JobKind, JobStatus


class Claim(enum.StrEnum):
    """What a worker should do with a delivered job message (its value is what the delivery
    logs and returns when it does not run the job)."""

    RUN = "run"  # claimed: run it
    DUPLICATE = "duplicate"  # another live worker is running it: drop this delivery
    FINISHED = "finished"  # already over (or cancelled): drop
    EXHAUSTED = "exhausted"  # attempts used up: it was just marked failed
    MISSING = "missing"  # no such job row


@dataclass(frozen=True)
class Placement:
    worker: str
    node: str
    device: str


class IdempotencyKeyTaken(Conflict):
    """Another submit already made a job with this idempotency key (the unique index said so)."""


def create_job(url: str, kind: str, params: dict[str, Any], requested: str, queue: str,
               rejected: str | None = None, owner: str | None = None,
               priority: Priority = Priority(), held: bool = False,
               team: str | None = None) -> int:
    """A queued job, or (with `rejected`) one that failed at submit for that reason (a submit
    queues its jobs with `create_jobs`)."""
    with session_scope(url) as session:
        job = Job(kind=kind, params=params, requested_device=requested, queue=queue,
                  status=JobStatus.FAILED if rejected else JobStatus.QUEUED, progress=0.0,
                  attempts=0, error=rejected, finished_at=utcnow() if rejected else None,
                  owner=owner, team=team, priority=priority.level,
                  preemptible=priority.preemptible, held=held and not rejected)
        session.add(job)
        session.flush()
        return job.id


def create_jobs(url: str, kind: str, params: list[dict[str, Any]], requested: str,
                queue: str, owner: str | None = None, priority: Priority = Priority(),
                held: bool = False, team: str | None = None,
                keys: list[str] | None = None, after: list[int] | None = None) -> list[int]:
    """Queued jobs in one transaction, job i carrying idempotency key `keys[i]` when given
    (IdempotencyKeyTaken when one is taken: the unique index decides between two submits racing
    with one key, so only one set of jobs is ever made). Jobs that wait for others (`after`)
    are written held and awaiting: the dependency pass releases or fails them.

    On PostgreSQL the ids come from the table's sequence and the rows go by COPY: ORM inserts
    cost about a millisecond of CPU a job, which made a submit of 100,000 jobs take minutes."""
    named: list[str | None] = list(keys) if keys is not None else [None] * len(params)
    after = after or None  # an empty list waits for nothing
    awaiting = after is not None
    try:
        with session_scope(url) as session:
            if session.get_bind().dialect.name == "postgresql":
                return _copy_jobs(session, kind, params, requested, queue, owner, priority,
                                  held or awaiting, team, named, after)
            rows = [Job(kind=kind, params=p, requested_device=requested, queue=queue,
                        status=JobStatus.QUEUED, progress=0.0, attempts=0, owner=owner, team=team,
                        priority=priority.level, preemptible=priority.preemptible,
                        held=held or awaiting, idempotency_key=key, after=after,
                        awaiting=awaiting)
                    for p, key in zip(params, named, strict=True)]
            session.add_all(rows)
            session.flush()
            return [r.id for r in rows]
    except (IntegrityError, psycopg.errors.UniqueViolation):
        if keys is None:
            raise
        raise IdempotencyKeyTaken(f"idempotency key {keys[0]!r} is already taken") from None


_COPY_COLUMNS = ("id", "kind", "params", "requested_device", "queue", "status", "progress",
                 "attempts", "submitted_at", "owner", "priority", "preemptible", "preemptions", "held",
                 "team", "idempotency_key", "after", "awaiting")


def _copy_jobs(session: Session, kind: str, params: list[dict[str, Any]], requested: str,
               queue: str, owner: str | None, priority: Priority, held: bool,
               team: str | None, keys: list[str | None], after: list[int] | None) -> list[int]:
    ids = list(session.scalars(text("SELECT nextval(pg_get_serial_sequence('jobs', 'id')) "
                                    "FROM generate_series(1, :n)"), {"n": len(params)}))
    now = utcnow()
    raw = cast(Any, session.connection().connection)  # the driver's (psycopg) connection
    with raw.cursor() as cur, cur.copy(f"COPY jobs ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy:
        for job_id, p, key in zip(ids, params, keys, strict=True):
            copy.write_row((job_id, kind, json.dumps(p), requested, queue, JobStatus.QUEUED, 0.0, 0,
                            now, owner, priority.level, priority.preemptible, 0, held, team, key,
                            None if after is None else json.dumps(after), after is not None))
    return ids


# A job's route: what publishing its message needs (`route_of`).
ROUTE = (Job.kind, Job.queue, Job.priority, Job.attempts)


def route_of(row: Row[*tuple[Any, ...]]) -> JobRoute:
    """The route of a row read or returned with the ROUTE columns: its task, its queue, its turn."""
    return {"kind": JobKind(row.kind), "queue": row.queue, "priority": row.priority,
            "started": row.attempts > 0}


def charged() -> ColumnElement[int]:
    """The attempts the limit counts: a job's claims less those that ended in a yield or a device
    fault (the claim that resumes after either continues the same attempt)."""
    return Job.attempts - Job.preemptions - Job.device_faults


def exhausted_message(attempts: int, limit: int, worker: str | None) -> str:
    """Why a job failed once `attempts` (its claims less its preemptions and device faults, as
    the limit counts them: a resumption after a yield is no attempt) reached `limit`."""
    return (f"gave up after {attempts} attempts (limit {limit}): the worker died while "
            f"running this job each time (last on {worker})")


def heartbeat_stale(cutoff: datetime) -> ColumnElement[bool]:
    """No heartbeat since `cutoff` (or none at all: requeued, waiting for a new claim)."""
    return or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < cutoff)


def claimable(cutoff: datetime) -> ColumnElement[bool]:
    """Queued, or running without a heartbeat since `cutoff` (its worker is gone)."""
    return or_(Job.status == JobStatus.QUEUED,
               and_(Job.status == JobStatus.RUNNING, heartbeat_stale(cutoff)))


def unclaimable(status: str, heartbeat_at: datetime | None, cutoff: datetime) -> Claim | None:
    """Why a job as just read cannot be claimed (over, or a live worker runs it), else None.

    Lets a worker drop a late delivery after one read; `claim` stays the arbiter of the rest."""
    if status in FINISHED:
        return Claim.FINISHED
    if status == JobStatus.RUNNING and heartbeat_at is not None and as_utc(heartbeat_at) >= cutoff:
        return Claim.DUPLICATE
    return None


def job_row(url: str, job_id: int) -> JobRow | None:
    """The job as a worker needs it to run a delivery or publish it again; None: no such job."""
    with session_scope(url) as session:
        job = session.get(Job, job_id)
        if job is None:
            return None
        return {"id": job.id, "kind": JobKind(job.kind), "status": JobStatus(job.status),
                "params": dict(job.params), "queue": job.queue, "requested_device": job.requested_device,
                "parent_id": job.parent_id, "heartbeat_at": job.heartbeat_at,
                "committed": job.committed, "attempts": job.attempts, "worker": job.worker,
                "priority": job.priority, "preemptions": job.preemptions,
                "device_faults": job.device_faults, "clock_from": _clock_from(session, job)}


def _clock_from(session: Session, job: Job) -> datetime | None:
    """When the job's time limit counts from: its first attempt's start, or its parent's (a
    chunk or a node's part shares its job's clock); None before any start."""
    parent = session.get(Job, job.parent_id) if job.parent_id is not None else None
    return as_utc((parent.first_started_at if parent is not None else None) or job.first_started_at)


def taken_by(at: Placement, now: datetime) -> dict[str, object]:
    """The columns a claim sets: the job runs for `at` from `now`, one more attempt."""
    return dict(status=JobStatus.RUNNING, worker=at.worker, node=at.node, device=at.device,
                attempts=Job.attempts + 1, started_at=now,
                first_started_at=func.coalesce(Job.first_started_at, now), heartbeat_at=now,
                progress_at=now, error=None)


def succeeded(samples: int, seconds: float, result: Mapping[str, object], now: datetime) -> dict[str, object]:
    """The columns a success sets (one job's, or a batch member's)."""
    return dict(status=JobStatus.SUCCEEDED, finished_at=now, progress=1.0, samples=samples,
                seconds=seconds, samples_per_sec=samples / seconds if seconds > 0 else None,
                result=result, heartbeat_at=None)


def metric_point(job_id: int, step: int, device: str, samples: int, seconds: float,
                 now: datetime) -> dict[str, object]:
    """One throughput point's row (`job_metrics`)."""
    return dict(job_id=job_id, step=step, at=now, device=device, samples=samples, seconds=seconds,
                samples_per_sec=samples / seconds if seconds > 0 else 0.0)


def claim(url: str, job_id: int, at: Placement, max_attempts: int, ttl: float) -> Claim:
    """Take the job for `at` in one atomic update, or say why not (`take` also gives the fence)."""
    taken = take(url, job_id, at, max_attempts, ttl)
    return Claim.RUN if isinstance(taken, Fence) else taken


@db_retry
def take(url: str, job_id: int, at: Placement, max_attempts: int, ttl: float) -> Fence | Claim:
    """Take the job for `at` in one atomic update: the new attempt's fence, or why not."""
    now = utcnow()
    cutoff = now - timedelta(seconds=ttl)
    with session_scope(url) as session:
        attempt = session.scalar(
            update(Job)
            .where(Job.id == job_id, charged() < max_attempts, claimable(cutoff))
            .values(**taken_by(at, now))
            .returning(Job.attempts)
        )
        if attempt is not None:
            return Fence(job_id, at.worker, attempt)
        job = session.get(Job, job_id)
        if job is None:
            return Claim.MISSING
        if (verdict := unclaimable(job.status, job.heartbeat_at, cutoff)) is not None:
            return verdict
        # Claimable but not taken: its attempts are used up (or a racing claim won).
        return Claim.EXHAUSTED if _fail_exhausted(session, job_id, cutoff, max_attempts) else Claim.DUPLICATE


def _fail_exhausted(session: Session, job_id: int, cutoff: datetime, max_attempts: int) -> bool:
    job = session.get(Job, job_id)
    if job is None:
        return False
    message = exhausted_message(job.attempts - job.preemptions - job.device_faults, max_attempts,
                                job.worker)
    failed = bool(rowcount(session.execute(
        update(Job)
        .where(Job.id == job_id, charged() >= max_attempts, claimable(cutoff))
        .values(status=JobStatus.FAILED, finished_at=utcnow(), error=message, heartbeat_at=None)
    )))
    if failed:
        job_ended(session, [job_id])
    return failed

def stuck(url: str, no_progress_before: datetime, cancel_before: datetime) -> tuple[list[int], list[int]]:
    """Running jobs that made no progress since `no_progress_before`, and running jobs whose
    cancel, asked before `cancel_before`, was not heeded: what the reconciler ends."""
    since = func.coalesce(Job.progress_at, Job.started_at)
    part = aliased(Job)  # a parent runs while its chunks or nodes do: they are judged, not it
    with session_scope(url) as session:
        running = select(Job.id).where(Job.status == JobStatus.RUNNING,
                                       ~exists().where(part.parent_id == Job.id))
        stalled = list(session.scalars(running.where(since < no_progress_before)))
        ignored = session.scalars(running.where(Job.cancel_requested_at < cancel_before,
                                                since >= no_progress_before))
        return stalled, list(ignored)


@db_retry
def end_stuck(url: str, job_id: int, status: JobStatus, reason: str) -> bool:
    """A running job the reconciler ends, whatever its worker does (no progress: failed; a cancel
    not heeded: cancelled), and its `stalled` event in the same transaction: whoever sees the job
    ended by the reconciler sees why."""
    with session_scope(url) as session:
        ended = rowcount(session.execute(
            update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING)
            .values(status=status, finished_at=utcnow(), heartbeat_at=None, error=reason)))
        if ended:
            events.add(session, job_id, events.STALLED, reason)
            job_ended(session, [job_id])
    if ended:
        events.logged(job_id, events.STALLED, reason)
    return bool(ended)


@db_retry
def set_progress(url: str, job_id: int, progress: float, fence: Fence | None = None) -> RunCheck:
    """Progress of a job, and of its parent (the mean over its chunks) when it is a chunk; returns
    what its attempt (when its fence is given) should do next, as `run_check` would, from the same
    statement (at 1,000 devices each statement a running job saves is hundreds a second)."""
    where = fence.holds() if fence is not None else [Job.id == job_id, Job.status == JobStatus.RUNNING]
    with session_scope(url) as session:
        now = utcnow()
        row = session.execute(update(Job).where(*where)
                              .values(progress=min(max(progress, 0.0), 1.0), heartbeat_at=now,
                                      progress_at=now)
                              .returning(Job.parent_id, Job.cancel_requested_at,
                                         Job.preempt_for)).one_or_none()
        if row is None:
            return RunCheck.LOST
        if row.parent_id is not None:
            mean = session.scalar(select(func.avg(Job.progress)).where(Job.parent_id == row.parent_id))
            session.execute(update(Job).where(Job.id == row.parent_id, Job.status == JobStatus.RUNNING)
                            .values(progress=mean))
        return RunCheck.of(row.cancel_requested_at, row.preempt_for)


@db_retry
def record_metric(url: str, fence: Fence, step: int, device: str, samples: int,
                  seconds: float) -> bool:
    """One point of throughput over time, keyed by (job, step) so a rerun overwrites it; written
    only while the job is still the attempt's (False: refused, nothing written), so a paused
    attempt that comes back cannot replace its successor's point."""
    with session_scope(url) as session:
        if not still_ours(session, fence):
            return False
        session.query(JobMetric).filter(JobMetric.job_id == fence.job_id,
                                        JobMetric.step == step).delete()
        session.execute(insert(JobMetric).values(**metric_point(fence.job_id, step, device, samples,
                                                           seconds, utcnow())))
    return True


def next_metric_step(url: str, job_id: int) -> int:
    """The step after the job's last throughput point: a resumed attempt adds to the earlier ones."""
    with session_scope(url) as session:
        last = session.scalar(select(func.max(JobMetric.step)).where(JobMetric.job_id == job_id))
    return 0 if last is None else last + 1


@db_retry
def succeed(url: str, fence: Fence, samples: int, seconds: float, result: dict[str, Any]) -> bool:
    """The attempt's job succeeded (False: the job is no longer this attempt's)."""
    with session_scope(url) as session:
        done = bool(rowcount(session.execute(
            update(Job).where(*fence.holds()).values(**succeeded(samples, seconds, result, utcnow()))
        )))
        if done:
            job_ended(session, [fence.job_id])
        return done


@db_retry
def fail(url: str, job_id: int, error: str, worker: str | None = None,
         fence: Fence | None = None) -> bool:
    """Mark a job failed from queued or running (only by its attempt `fence`, or by `worker`,
    when given)."""
    cond = [Job.id == job_id, Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING])]
    if fence is not None:
        cond = fence.holds()
    elif worker is not None:
        cond.append(Job.worker == worker)
    with session_scope(url) as session:
        failed = bool(rowcount(session.execute(
            update(Job).where(*cond)
            .values(status=JobStatus.FAILED, finished_at=utcnow(), error=error, heartbeat_at=None)
        )))
        if failed:
            job_ended(session, [job_id])
        return failed


@db_retry
def device_faulted(url: str, fence: Fence, limit: int) -> bool | None:
    """The attempt `fence` stopped because its device failed: True, the job is queued again (the
    attempt not counted, what it committed kept, `device_faults` one more); False, it already
    had `limit` - 1 device faults and is left running for its caller to fail (a fault that
    follows a job from device to device is the job's); None, it is no longer this attempt's."""
    with session_scope(url) as session:
        faults = session.scalar(select(Job.device_faults).where(*fence.holds()))
        if faults is None:
            return None
        if faults + 1 >= limit:
            return False
        return bool(rowcount(session.execute(
            update(Job).where(*fence.holds(), Job.device_faults == faults)
            .values(status=JobStatus.QUEUED, heartbeat_at=None, device_faults=faults + 1)))) or None


@db_retry
def clear_heartbeat(url: str, job_id: int, stale_before: datetime | None = None) -> bool:
    """A running job taken for dead: the next delivery may claim it at once.

    With `stale_before`, only if its heartbeat is still older than that (the worker did not
    come back meanwhile); True when the job was taken over."""
    cond = [Job.id == job_id, Job.status == JobStatus.RUNNING]
    if stale_before is not None:
        cond.append(heartbeat_stale(stale_before))
    with session_scope(url) as session:
        return bool(rowcount(session.execute(update(Job).where(*cond).values(heartbeat_at=None))))


@db_retry
def orphan(url: str, worker: str) -> list[int]:
    """The running jobs of a worker known dead, their heartbeat cleared so they can be re-claimed.

    A parent whose chunks are out is not the worker's any more: its chunks run it. A job already
    orphaned (no heartbeat) was requeued when the worker died before; it waits for its delivery.
    """
    with session_scope(url) as session:
        ids = list(session.scalars(select(Job.id).where(Job.worker == worker, Job.chunks.is_(None),
                                                        Job.status == JobStatus.RUNNING,
                                                        Job.heartbeat_at.is_not(None))))
        if ids:
            session.execute(update(Job).where(Job.id.in_(ids), Job.status == JobStatus.RUNNING)
                            .values(heartbeat_at=None))
        return ids



def earlier_seconds(url: str, job_id: int) -> float:
    """Compute seconds its throughput points hold: what earlier attempts of a resumed job spent."""
    with session_scope(url) as session:
        return float(session.scalar(select(func.sum(JobMetric.seconds))
                                    .where(JobMetric.job_id == job_id)) or 0.0)


class CancelOutcome(enum.Enum):
    CANCELLED = "cancelled"  # it was queued: it will never run
    REQUESTED = "requested"  # it is running: it stops at its next batch or epoch boundary
    FINISHED = "finished"  # already over: nothing to do
    MISSING = "missing"


def cancel(url: str, job_id: int) -> CancelOutcome:
    """Cancel a job and its chunks: queued ones at once, running ones at their next boundary."""
    now = utcnow()
    with session_scope(url) as session:
        job = session.get(Job, job_id)
        if job is None:
            return CancelOutcome.MISSING
        if job.status in FINISHED:
            return CancelOutcome.FINISHED
        ids = [job_id, *session.scalars(select(Job.id).where(Job.parent_id == job_id))]
        session.execute(update(Job).where(Job.id.in_(ids), Job.status == JobStatus.QUEUED)
                        .values(status=JobStatus.CANCELLED, finished_at=now, error="cancelled"))
        session.execute(update(Job).where(Job.id.in_(ids), Job.status == JobStatus.RUNNING)
                        .values(cancel_requested_at=now))
        session.flush()
        chunked = job.chunks is not None
    if chunked:
        settle_parent(url, job_id)  # every chunk may have been queued, and so is over now
    with session_scope(url) as session:
        status = session.scalar(select(Job.status).where(Job.id == job_id))
    return CancelOutcome.CANCELLED if status == JobStatus.CANCELLED else CancelOutcome.REQUESTED


@db_retry
def run_check(url: str, fence: Fence) -> RunCheck:
    """What a running job's attempt should do at its next batch or epoch boundary."""
    with session_scope(url) as session:
        row = session.execute(select(Job.status, Job.worker, Job.attempts, Job.cancel_requested_at,
                                     Job.preempt_for)
                              .where(Job.id == fence.job_id)).one_or_none()
    if (row is None or row.status != JobStatus.RUNNING or row.worker != fence.worker
            or row.attempts != fence.attempt):
        return RunCheck.LOST
    return RunCheck.of(row.cancel_requested_at, row.preempt_for)


@db_retry
def mark_cancelled(url: str, fence: Fence, samples: int | None = None) -> bool:
    """A running job stopped on request; what it wrote is kept."""
    with session_scope(url) as session:
        return bool(rowcount(session.execute(
            update(Job).where(*fence.holds())
            .values(status=JobStatus.CANCELLED, finished_at=utcnow(), heartbeat_at=None,
                    samples=samples, error="cancelled while running; partial results kept")
        )))
