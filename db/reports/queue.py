"""The queue as SQL holds it: the waiting jobs in the order workers take them (`mxq queue`, the
dashboard's queue view, `GET /api/v1/queue`)."""

from __future__ import annotations

from sqlalchemy import case, select

from mxq.db.engine import session_scope
from mxq.db.records import QueuedJob
from mxq.db.schema import Job, iso
from mxq.priorities import RANK
from mxq.status import JobKind, JobStatus

# What runs next first: the higher priority, then a job that started before (preempted, or its
# worker died: published ahead of its priority's new jobs), then the oldest.
NEXT_FIRST = (case(*((Job.priority == level, -rank) for level, rank in RANK.items()), else_=0),
              case((Job.attempts > 0, 0), else_=1), Job.id)


def waiting(url: str, limit: int) -> list[QueuedJob]:
    """The first `limit` queued jobs (chunked parents apart: their chunks wait for them)."""
    with session_scope(url) as session:
        rows = session.scalars(select(Job).where(Job.status == JobStatus.QUEUED, Job.chunks.is_(None))
                               .order_by(*NEXT_FIRST).limit(limit))
        return [{"id": j.id, "kind": JobKind(j.kind), "owner": j.owner, "priority": j.priority,
                 "preemptible": j.preemptible, "queue": j.queue, "submitted_at": iso(j.submitted_at),
                 "started_before": j.attempts > 0, "preemptions": j.preemptions, "held": j.held}
                for j in rows]
