"""Jobs of a worker that died: hand them to another delivery, or fail them at the attempt cap.

Redis would redeliver the dead worker's unacknowledged message only after the visibility timeout
(hours, to fit long jobs), so the launcher republishes at once; the claim in SQL makes sure a
later second delivery of the same job is dropped.
"""

from __future__ import annotations

from mxq.db import jobs
from mxq.db.engine import session_scope
from mxq.db.schema import Job
from mxq.workers.broker.publish import requeue
from mxq.workers.settings import Settings


def recover_worker(settings: Settings, worker: str) -> list[int]:
    """Requeue (or fail, past the cap) every job `worker` was running; return their ids."""
    ids = jobs.orphan(settings.database, worker)
    for job_id in ids:
        with session_scope(settings.database) as session:
            job = session.get(Job, job_id)
            if job is None:
                continue
            kind, queue = job.kind, job.queue
        requeue(settings, job_id, kind, queue, f"worker {worker} died while running it")
    return ids
