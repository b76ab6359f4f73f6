"""What the OpenLineage export sends next, read from the jobs table, its outbox.

Every inference and training a user submitted (not a chunk, not a node's part: their parent is
the run) has two events: START once it first started, and its end (COMPLETE, FAIL or ABORT) once
it ended. Both are read from the job's own row, which its claim and its end write anyway, so the
export costs a job nothing, an event outlives any crash (the row is the record), and a slow
receiver delays only the export. `openlineage_runs` says which of the two went; the cursor,
below which every job needs nothing more, keeps each scan short.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mxq.db.engine import session_scope
from mxq.db.retry import db_retry
from mxq.db.schema import Fire, Job, OpenLineageCursor, OpenLineageRun, ScoredInput, as_utc, utcnow
from mxq.db.webhooks.outbox import backoff
from mxq.status import JobStatus

KINDS = ("infer", "train")
ENDED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
SCAN = 500  # jobs read per pass, from the cursor on
# A job submitted this recently may have an id below one already seen (its transaction commits
# later): the cursor never passes it until it is this old.
SETTLE = timedelta(minutes=1)
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class RunFacts:
    """What one job's event says: its row, and the schedule that fired it, if one did."""

    id: int
    kind: str
    status: str
    params: dict[str, Any]
    result: dict[str, Any]
    error: str | None
    devices: list[str]
    started_at: datetime | None  # its first start
    finished_at: datetime | None
    samples: int | None
    samples_per_sec: float | None
    schedule: str | None  # the schedule's name, when a fire made it
    fire_id: int | None
    start_due: bool  # START is to be sent
    end_due: bool  # its end is to be sent


def _cursor(session: Session) -> int:
    """The cursor, made at the first pass: from the next job submitted on."""
    row = session.get(OpenLineageCursor, 1)
    if row is None:
        last = session.scalar(select(func.max(Job.id))) or 0
        row = OpenLineageCursor(id=1, low_job_id=last + 1, enabled_at=utcnow())
        session.add(row)
        session.flush()
    return int(row.low_job_id)


@db_retry
def due(url: str, now: datetime | None = None) -> list[RunFacts]:
    """The jobs with an event to send now, in id order (at most SCAN read), and the cursor moved
    past those that need nothing more."""
    now = now or utcnow()
    with session_scope(url) as session:
        low = _cursor(session)
        rows = session.execute(
            select(Job, OpenLineageRun).outerjoin(OpenLineageRun, OpenLineageRun.job_id == Job.id)
            .where(Job.id >= low, Job.kind.in_(KINDS), Job.parent_id.is_(None))
            .order_by(Job.id).limit(SCAN)).all()
        fires = _fires(session, [job.id for job, _ in rows])
        facts: list[RunFacts] = []
        settled: list[int] = []
        for job, sent in rows:
            start, end = _unsent(job, sent)
            if not (start or end) and job.status in ENDED:
                settled.append(job.id)
            if (start or end) and not _waiting(sent, now):
                facts.append(_facts(job, fires.get(job.id), start, end))
        _advance(session, low, [job for job, _ in rows], settled, now)
        return facts


def _unsent(job: Job, sent: OpenLineageRun | None) -> tuple[bool, bool]:
    """Whether the job's START and its end are due: it started (ended) and that event did not go."""
    start = job.first_started_at is not None and (sent is None or sent.started_sent_at is None)
    end = job.status in ENDED and (sent is None or sent.ended_sent_at is None)
    return start, end


def _fires(session: Session, job_ids: list[int]) -> dict[int, tuple[int, str | None]]:
    """The fire that made each of `job_ids` and its schedule's name: a training's fire names its
    job, an inference fire's jobs are in its claims (scored_inputs)."""
    if not job_ids:
        return {}
    trained = session.execute(select(Fire.job_id, Fire.id, Fire.schedule_name)
                              .where(Fire.job_id.in_(job_ids)))
    scored = session.execute(select(ScoredInput.job_id, Fire.id, Fire.schedule_name)
                             .join(Fire, Fire.id == ScoredInput.fire_id)
                             .where(ScoredInput.job_id.in_(job_ids)))
    return {int(job): (int(fire), name) for job, fire, name in [*trained, *scored]}


def _waiting(sent: OpenLineageRun | None, now: datetime) -> bool:
    """Its last send failed and the next try is not due yet."""
    return sent is not None and sent.next_attempt_at is not None and as_utc(sent.next_attempt_at) > now


def _advance(session: Session, low: int, jobs: list[Job], settled: list[int], now: datetime) -> None:
    """Move the cursor past the leading jobs that need nothing more (ended, both events sent)."""
    done = set(settled)
    new_low = low
    for job in jobs:
        if job.id not in done or as_utc(job.submitted_at) > now - SETTLE:
            new_low = job.id
            break
        new_low = job.id + 1
    if new_low != low:
        session.get_one(OpenLineageCursor, 1).low_job_id = new_low  # made by `_cursor`


def _facts(job: Job, fire: tuple[int, str | None] | None, start: bool, end: bool) -> RunFacts:
    return RunFacts(job.id, job.kind, job.status, job.params or {}, job.result or {}, job.error,
                    list(job.devices or ([job.device] if job.device else [])),
                    as_utc(job.first_started_at), as_utc(job.finished_at), job.samples,
                    job.samples_per_sec, fire[1] if fire else None, fire[0] if fire else None,
                    start, end)


@db_retry
def sent(url: str, job_id: int, start: bool, end: bool) -> None:
    """The job's START (`start`) and its end (`end`) went."""
    now = utcnow()
    with session_scope(url) as session:
        row = session.get(OpenLineageRun, job_id) or OpenLineageRun(job_id=job_id, attempts=0)
        if start:
            row.started_sent_at = now
        if end:
            row.ended_sent_at = now
        row.attempts, row.next_attempt_at, row.last_error = 0, None, None
        session.add(row)


@db_retry
def failed(url: str, job_id: int, error: str) -> None:
    """A send of the job's events failed: tried again after a wait that doubles, 30 s to an hour."""
    with session_scope(url) as session:
        row = session.get(OpenLineageRun, job_id) or OpenLineageRun(job_id=job_id, attempts=0)
        row.attempts = (row.attempts or 0) + 1
        row.next_attempt_at = utcnow() + backoff(row.attempts)  # the webhooks' waits
        row.last_error = error[:MAX_ERROR_CHARS]
        session.add(row)
