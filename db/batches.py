"""Dynamic batching in SQL: the queued inference jobs a batch may take, taking them in one update,
finishing them in one transaction, and handing them back when the batch's device fails
(`mxq.tasks.inference.batching`). Each member moves as `mxq.db.jobs` moves one job: only from the
statuses it may leave, only while the batch still holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TypeAlias

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from mxq.db.engine import session_scope
from mxq.db.fence import Fence, still_ours
from mxq.db.jobs import Placement, metric_point, succeeded, taken_by
from mxq.db.outputs import predictions
from mxq.db.outputs.blocks import Block
from mxq.db.retry import db_retry
from mxq.db.schema import Job, JobMetric, utcnow
from mxq.db.webhooks.outbox import job_ended
from mxq.json_types import JsonObject
from mxq.status import JobKind, JobStatus

# A member's outcome: (samples, seconds, result).
Outcome: TypeAlias = tuple[int, float, Mapping[str, object]]


@db_retry
def queued_infer(url: str, queues: list[str], limit: int,
                 level: str = "normal") -> list[tuple[int, JsonObject]]:
    """The oldest queued, unchunked inference jobs on `queues` of priority `level` (a batch never
    takes a lower level ahead of its turn) that no attempt started storing and admission does not
    hold (`held`: a batch never takes a job past its owner's quota): (id, params)."""
    with session_scope(url) as session:
        return [(r.id, r.params) for r in session.execute(
            select(Job.id, Job.params).where(Job.status == JobStatus.QUEUED, Job.kind == JobKind.INFER,
                                             Job.queue.in_(queues), Job.parent_id.is_(None),
                                             Job.committed.is_(None), Job.priority == level,
                                             Job.held.is_(False))
            .order_by(Job.id).limit(limit))]


@db_retry
def claim_many(url: str, ids: list[int], at: Placement) -> list[int]:
    """Take those of `ids` still queued for `at` in one update; return the ones taken."""
    if not ids:
        return []
    now = utcnow()
    with session_scope(url) as session:
        return sorted(session.scalars(
            update(Job).where(Job.id.in_(ids), Job.status == JobStatus.QUEUED)
            .values(**taken_by(at, now))
            .returning(Job.id)))


@db_retry
def finish_batch(url: str, outcomes: Mapping[int, Outcome], fence: Fence,
                 at: Placement, blocks: list[Block] | None = None) -> set[int]:
    """One transaction for a dynamic batch: of the jobs `outcomes` names (id -> samples, seconds,
    result), those still this batch's (the lead, `fence`'s job, while its attempt holds it; the
    others while running on `at`'s worker) get their rows (`blocks`, replacing any stored before:
    a redelivered lead's), a throughput point, and, all but the lead (which its own task
    finishes), success. A job taken over meanwhile keeps what its new attempt writes. Returns
    the jobs finished so."""
    now = utcnow()
    with session_scope(url) as session:
        ours = _still_batched(session, set(outcomes), fence, at)
        if not ours:
            return ours
        if blocks is not None:
            predictions.clear(session, sorted(ours))
            predictions.add(session, [b for b in blocks if b.owner in ours])
        session.query(JobMetric).filter(JobMetric.job_id.in_(ours), JobMetric.step == 0).delete()
        session.execute(insert(JobMetric), [metric_point(i, 0, at.device, n, sec, now)
                                            for i, (n, sec, _) in outcomes.items() if i in ours])
        _succeed_members(session, {i: o for i, o in outcomes.items() if i != fence.job_id and i in ours},
                         at, now)
        return ours


def _succeed_members(session: Session, outcomes: Mapping[int, Outcome], at: Placement, now: datetime) -> None:
    """The batch's members (all but its lead) succeed, still running on `at`'s worker."""
    done = [{"job_id": job_id, **succeeded(samples, seconds, result, now)}
            for job_id, (samples, seconds, result) in outcomes.items()]
    if outcomes:  # one executemany, not a statement per job
        table = Job.__table__
        assert isinstance(table, Table)
        session.execute(update(table).where(table.c.id == bindparam("job_id"),
                                            table.c.worker == at.worker,
                                            table.c.status == JobStatus.RUNNING), done)
        job_ended(session, list(outcomes))


def _still_batched(session: Session, ids: set[int], fence: Fence, at: Placement) -> set[int]:
    """Of `ids`, the jobs the batch still holds, their rows locked for the transaction."""
    lead = {fence.job_id} & ids
    ours = {fence.job_id} if lead and still_ours(session, fence) else set()
    others = ids - lead
    if others:
        ours |= set(session.scalars(select(Job.id).where(
            Job.id.in_(others), Job.worker == at.worker, Job.status == JobStatus.RUNNING)
            .with_for_update()))
    return ours


@db_retry
def hand_back(url: str, ids: list[int], worker: str) -> list[tuple[int, str, str]]:
    """Jobs a dynamic batch took (`claim_many`) whose device failed under the batch: queued again
    as `device_faulted` queues a job (the attempt not counted, `device_faults` one more); each
    one's (id, queue, priority) for its message."""
    if not ids:
        return []
    with session_scope(url) as session:
        rows = session.execute(
            update(Job).where(Job.id.in_(ids), Job.worker == worker, Job.status == JobStatus.RUNNING)
            .values(status=JobStatus.QUEUED, heartbeat_at=None, device_faults=Job.device_faults + 1)
            .returning(Job.id, Job.queue, Job.priority))
        return sorted((job_id, queue, priority) for job_id, queue, priority in rows)
