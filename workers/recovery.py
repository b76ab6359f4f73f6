"""Jobs of a worker that died: hand them to another delivery, or fail them at the attempt cap.

Redis would redeliver the dead worker's unacknowledged message only after the visibility timeout
(hours, to fit long jobs), so the launcher republishes at once; the claim in SQL makes sure a
later second delivery of the same job is dropped.
"""

from __future__ import annotations

import logging

from db import jobs
from db.engine import session_scope
from db.schema import Job
from workers.settings import Settings
from workers.submit import publish

log = logging.getLogger(__name__)


def recover_worker(settings: Settings, worker: str) -> list[int]:
    """Requeue (or fail, past the cap) every job `worker` was running; return their ids."""
    ids = jobs.orphan(settings.database, worker)
    for job_id in ids:
        with session_scope(settings.database) as s:
            job = s.get(Job, job_id)
            kind, queue, attempts = job.kind, job.queue, job.attempts
        if attempts >= settings.max_attempts:
            jobs.fail(settings.database, job_id,
                      jobs.exhausted_message(attempts, settings.max_attempts, worker))
            log.error("job %s failed: its worker died on all %s attempts", job_id, attempts)
        else:
            publish(settings, job_id, kind, queue)
            log.warning("job %s requeued to %s: worker %s died (attempt %s of %s)",
                        job_id, queue, worker, attempts, settings.max_attempts)
    return ids
