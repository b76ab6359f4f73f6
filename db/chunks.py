"""A job split into parts in SQL: an inference job's chunks, a multi-node training's nodes, made
once under their parent (`fan_out`), and the parent finished once every part has (`settle_parent`,
as `mxq.parts.settle` says).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select, update

from mxq import parts
from mxq.db import events
from mxq.db.engine import rowcount, session_scope
from mxq.db.outputs.epochs import merge_parts
from mxq.db.retry import db_retry
from mxq.db.schema import Job, utcnow
from mxq.db.webhooks.outbox import job_ended
from mxq.status import FINISHED, JobKind, JobStatus


@db_retry
def fan_out(url: str, parent_id: int, kind: str, chunk_params: Sequence[Mapping[str, object]],
            queue: str | list[str], requested: str | list[str],
            held: bool = False) -> list[tuple[int, bool, str]]:
    """Create the parent's chunk jobs once (on `queue`, or chunk i on queue[i]; `held` for the
    admitter to release while admission is on, so its owner's quota counts each); return
    (child id, to be published now: queued and not held, its queue) for each chunk.

    Run again after a redelivery it creates nothing new, so chunks are never doubled.
    """
    queues = [queue] * len(chunk_params) if isinstance(queue, str) else queue
    asked = [requested] * len(chunk_params) if isinstance(requested, str) else requested
    with session_scope(url) as session:
        parent = session.get_one(Job, parent_id)  # its chunks are its owner's, at its priority
        existing = {c.chunk_index: c for c in session.scalars(select(Job).where(Job.parent_id == parent_id))}
        for index, params in enumerate(chunk_params):
            if index not in existing:
                existing[index] = Job(kind=kind, params=params, requested_device=asked[index],
                                      queue=queues[index], status=JobStatus.QUEUED, progress=0.0,
                                      attempts=0, parent_id=parent_id, chunk_index=index,
                                      owner=parent.owner, team=parent.team,
                                      priority=parent.priority,
                                      preemptible=parent.preemptible, held=held)
                session.add(existing[index])
        session.execute(update(Job).where(Job.id == parent_id)
                        .values(chunks=len(chunk_params), heartbeat_at=None))
        session.flush()
        return [(existing[i].id, existing[i].status == JobStatus.QUEUED and not existing[i].held,
                 existing[i].queue) for i in range(len(chunk_params))]


@db_retry
def settle_parent(url: str, parent_id: int, why: str | None = None) -> bool:
    """Finish the parent once every chunk has, as `mxq.parts.settle` says (a multi-node
    training: its epochs merged first); with `why` (the reconciler's), a `settled` event saying so
    in the same transaction."""
    with session_scope(url) as session:
        children = list(session.scalars(select(Job).where(Job.parent_id == parent_id)
                                        .order_by(Job.chunk_index)))
        if not children or any(c.status not in FINISHED for c in children):
            return False
        kind = session.scalar(select(Job.kind).where(Job.id == parent_id))
    if kind == JobKind.TRAIN:
        merge_parts(url, parent_id)
    with session_scope(url) as session:
        children = list(session.scalars(select(Job).where(Job.parent_id == parent_id)
                                        .order_by(Job.chunk_index)))
        values = parts.settle(str(kind), children, utcnow())
        settled = rowcount(session.execute(update(Job).where(Job.id == parent_id,
                                                             Job.status == JobStatus.RUNNING)
                                           .values(**values)))
        if settled:
            job_ended(session, [parent_id])
        if settled and why is not None:
            events.add(session, parent_id, events.SETTLED, why)
    if settled and why is not None:
        events.logged(parent_id, events.SETTLED, why)
    return bool(settled)


def chunk_statuses(url: str, parent_id: int, but: int) -> list[str]:
    """The statuses of a parent's chunks other than `but`."""
    with session_scope(url) as session:
        return list(session.scalars(select(Job.status).where(Job.parent_id == parent_id,
                                                             Job.id != but)))
