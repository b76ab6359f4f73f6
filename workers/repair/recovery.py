"""Jobs of a worker that died: hand them to another delivery, or fail them at the attempt cap.

Redis would redeliver the dead worker's unacknowledged message only after the visibility timeout
(hours, to fit long jobs), so the launcher republishes at once; the claim in SQL makes sure a
later second delivery of the same job is dropped.
"""

from __future__ import annotations

from mxq.db import jobs
from mxq.workers.broker.publish import requeue
from mxq.workers.settings import Settings


def recover_worker(settings: Settings, worker: str) -> list[int]:
    """Requeue (or fail, past the cap) every job `worker` was running; return their ids."""
    ids = jobs.orphan(settings.database, worker)
    for job_id in ids:
        if (job := jobs.job_row(settings.database, job_id)) is not None:
            requeue(settings, job_id, job["kind"], job["queue"], f"worker {worker} died while running it")
    return ids
