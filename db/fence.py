"""The fence of one attempt of a job: every write an attempt makes carries it.

A worker can be paused (SIGSTOP, a long GC, a frozen VM) and come back after its job was handed
to another device. Its claim made attempt N; a later claim makes N+1. Every write of an attempt
(results with their position, progress, epochs, a trained model's registration, the outcome) is
made only while the job row still says `running`, by this worker, at attempt N: checked in the
same statement or transaction as the write, so a stale attempt's write is refused, never mixed
in. Files it writes carry the attempt in their name (`Fence.tag`), so one attempt can never
replace another's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import Session

from mxq.db.engine import rowcount
from mxq.db.schema import Job, utcnow
from mxq.status import JobStatus


@dataclass(frozen=True)
class Fence:
    """Attempt `attempt` of job `job_id`, run by `worker`."""

    job_id: int
    worker: str
    attempt: int

    def holds(self) -> list[ColumnElement[bool]]:
        """The job row is still this attempt's: the WHERE of every write it makes."""
        return [Job.id == self.job_id, Job.worker == self.worker, Job.attempts == self.attempt,
                Job.status == JobStatus.RUNNING]

    @property
    def tag(self) -> str:
        """The part of a file name only this attempt writes: `j<job>a<attempt>`."""
        return f"j{self.job_id}a{self.attempt}"


class RunCheck(enum.Enum):
    GO_ON = "go-on"
    CANCEL = "cancel"  # a cancel was requested
    PREEMPT = "preempt"  # a waiting job of a higher level asked it to yield (`yield_target`)
    LOST = "lost"  # the job is no longer this worker's (another took it over, or it is over)

    @classmethod
    def of(cls, cancel_requested_at: datetime | None, preempt_for: int | None) -> RunCheck:
        """A job still the attempt's: a cancel comes before a preemption."""
        if cancel_requested_at is not None:
            return cls.CANCEL
        return cls.GO_ON if preempt_for is None else cls.PREEMPT


class Superseded(Exception):
    """The job is no longer this attempt's: the write was refused (raised where a write cannot
    answer False)."""


def still_ours(session: Session, fence: Fence) -> bool:
    """Inside a write transaction: lock the job row if it is still this attempt's (its heartbeat
    refreshed), so what the transaction also writes lands only while the attempt holds the job."""
    return bool(rowcount(session.execute(update(Job).where(*fence.holds())
                                         .values(heartbeat_at=utcnow()))))
