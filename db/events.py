"""Job events: what happened to a job besides its run (requeues, retries, out-of-memory splits)."""

from __future__ import annotations

import logging

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from mxq.db.engine import session_scope
from mxq.db.records import EventRecord
from mxq.db.retry import db_retry
from mxq.db.schema import JobEvent, iso, utcnow

log = logging.getLogger(__name__)

# Kinds of event, so readers can filter on them.
REQUEUED = "requeued"  # its worker died or its heartbeat went stale: published again
REPUBLISHED = "republished"  # queued in SQL but its message was gone from the broker
LEASE_FREED = "lease-freed"  # a device lease it held outlived it
RETRY = "retry"  # a transient broker or database error was retried
OOM = "out-of-memory"  # a batch did not fit: the batch size was halved
RESUMED = "resumed"  # a later attempt of an inference job went on after its last stored sample
SETTLED = "settled"  # a parent whose chunks had all finished was closed by the reconciler
RESUBMITTED = "resubmitted"  # a schedule fire without a job got one
STALLED = "stalled"  # no progress, or a cancel not heeded: ended by the reconciler
DEVICE_FAULT = "device-fault"  # its device failed mid-attempt: queued again, no attempt used
PREEMPTED = "preempted"  # it yielded its devices to a waiting job of a higher level, to resume later


@db_retry
def record(url: str, job_id: int, kind: str, message: str, **data: object) -> None:
    with session_scope(url) as session:
        add(session, job_id, kind, message, **data)
    logged(job_id, kind, message)


def add(session: Session, job_id: int, kind: str, message: str, **data: object) -> None:
    """An event inside the caller's transaction: it commits with the change it explains, or not at
    all (a reader who sees a job ended also sees why). The caller logs it (`logged`) once the
    transaction committed."""
    session.execute(insert(JobEvent).values(job_id=job_id, at=utcnow(), kind=kind, message=message,
                                            data=data))


def logged(job_id: int, kind: str, message: str) -> None:
    """The log line of a committed event."""
    log.info("job %s %s: %s", job_id, kind, message)


def list_events(url: str, job_id: int) -> list[EventRecord]:
    with session_scope(url) as session:
        rows = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
        return [{"at": iso(e.at), "kind": e.kind, "message": e.message, "data": e.data}
                for e in rows]
