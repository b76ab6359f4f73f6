"""Cancel a job: queued ones are revoked at once, running ones stop at their next boundary; the
jobs that wait for a job cancelled at once (`--after`) fail now (`dependencies.settle_quietly`)."""

from __future__ import annotations

from mxq.db.jobs import CancelOutcome, cancel
from mxq.db.reports.history import JobNotFound
from mxq.workers.broker.app import app_for
from mxq.workers.jobs import dependencies
from mxq.workers.settings import Settings


def cancel_job(settings: Settings, job_id: int) -> CancelOutcome:
    outcome = cancel(settings.database, job_id)
    if outcome is CancelOutcome.MISSING:
        raise JobNotFound(f"no job {job_id}")
    if outcome is CancelOutcome.CANCELLED:
        # The claim would drop it anyway; revoking spares the worker the delivery.
        app_for(settings).control.revoke(f"job-{job_id}")
        dependencies.settle_quietly(settings)
    return outcome


MESSAGES = {
    CancelOutcome.CANCELLED: "job {id} cancelled (it had not started)",
    CancelOutcome.REQUESTED: "job {id} is running: it stops at its next batch or epoch and keeps "
                             "what it wrote",
    CancelOutcome.FINISHED: "job {id} had already finished; nothing to cancel",
}
