"""Publish a job's message: when it is submitted, and again when its worker died (requeue).

The launcher, the reconciler and the job frame need only this, not the submit path (validation,
routing, model resolution). A message carries only the job's id; the row says the rest.
"""

from __future__ import annotations

import logging
from datetime import datetime

from kombu.utils.url import maybe_sanitize_url

from mxq.db import events, jobs
from mxq.db.engine import session_scope
from mxq.db.jobs import delete_unstarted
from mxq.db.retry import retrying
from mxq.db.schema import Job
from mxq.errors import Unavailable
from mxq.workers.app import app_for
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)


class SubmitError(Unavailable):
    """The database or the broker cannot be reached: the job was not submitted."""


def task_name(kind: str) -> str:
    return f"mxq.{kind}"


def _send(broker: str, job_id: int, kind: str, queue: str) -> None:
    app_for(broker).send_task(task_name(kind), args=[job_id], queue=queue, task_id=f"job-{job_id}",
                              retry=True)


# Workers and the reconciler wait out a broker restart; a user's submit is told at once.
_send_patiently = retrying(lambda exc: not isinstance(exc, (TypeError, ValueError)))(_send)


def publish(settings: Settings, job_id: int, kind: str, queue: str,
            undo_on_failure: bool = False, patient: bool = False) -> None:
    """Send the job's message to `queue` (again, when requeuing a job whose worker died).

    `patient` (inside workers) retries for minutes through a broker restart."""
    try:
        (_send_patiently if patient else _send)(settings.broker, job_id, kind, queue)
    except Exception as exc:
        if undo_on_failure:
            delete_unstarted(settings.database, job_id)
        raise SubmitError(f"could not publish job {job_id} to {maybe_sanitize_url(settings.broker)}: "
                          f"{exc}") from None


def requeue(settings: Settings, job_id: int, kind: str, queue: str, why: str,
            stale_before: datetime | None = None) -> bool | None:
    """Publish a dead job again (True), or fail it when its attempts are used up (False).

    With `stale_before`, a job whose heartbeat came back meanwhile is left alone (None)."""
    with session_scope(settings.database) as session:
        job = session.get(Job, job_id)
        if job is None:
            return None
        attempts, worker = job.attempts, job.worker
    if not jobs.clear_heartbeat(settings.database, job_id, stale_before):
        return None
    if attempts >= settings.max_attempts:
        jobs.fail(settings.database, job_id,
                  jobs.exhausted_message(attempts, settings.max_attempts, worker))
        log.error("job %s failed: %s on all %s attempts", job_id, why, attempts)
        return False
    publish(settings, job_id, kind, queue, patient=True)
    events.record(settings.database, job_id, events.REQUEUED, f"requeued to {queue}: {why}",
                  attempts=attempts, worker=worker)
    return True
