"""Preemption: when a job of a higher level waits and the devices that could run it are busy,
the lowest-level preemptible job on one of them is asked to yield (`mxq.priorities.victim`).

The running job is only marked in SQL: it yields at its next checkpoint (an inference's flush,
a training's epoch), commits, and goes back to the queue ahead of its level's new jobs
(`tasks/runner`), so it loses nothing and resumes where it stopped. Asked after every submit
above the lowest level and at every reconciler pass, for the jobs that still wait.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from mxq.db.fleet import list_workers
from mxq.db.records import WorkerRecord
from mxq.db.sharing import preemption
from mxq.device import Device
from mxq.priorities import LOW, Waiting, victim
from mxq.workers.broker.queues import pool_of
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)
AT_SUBMIT = 64  # the first jobs of a submit asked for (a batch's next to run)
LOOK = 1000  # the waiting jobs a reconciler pass asks for


def capable(queue: str, workers: list[WorkerRecord]) -> frozenset[str]:
    """The devices (`node/device`) with a live worker that consumes `queue`."""
    live = [w for w in workers if w["alive"]]
    pool = pool_of(queue)
    if pool is None:
        return frozenset(f"{w['node']}/{w['device']}" for w in live if w["queue"] == queue)
    kind, engine = pool
    return frozenset(f"{w['node']}/{w['device']}" for w in live
                     if Device.parse(w["device"]).kind == kind and (engine is None or engine in w["engines"]))


def ask(settings: Settings, level: str | None = None,
        ids: list[int] | None = None) -> list[tuple[int, int]]:
    """Ask a running job to yield for each waiting job that needs one (of `ids` only, when
    given: the jobs a submit just queued); (asked, for) pairs.

    `level` is the level of a job just submitted: a `low` one preempts nothing (but a borrowed
    device, when MXQ_QUOTA_BORROWING lends them), so then nothing is read. Without `ids` (the
    reconciler's pass) the first LOOK waiting jobs are asked for: jobs that wait long for a
    device that is down come first by age, and must not hide the others."""
    if level == LOW and not settings.quota_borrowing:
        return []
    url = settings.database
    running = preemption.running(url, settings.heartbeat_ttl)
    if not any(r.preemptible or r.borrowed for r in running):
        return []  # nothing could yield: neither the workers nor a waiting job need be read
    workers = list_workers(url, settings.heartbeat_ttl)
    asked: list[tuple[int, int]] = []
    for job in preemption.waiting(url, LOOK, low=settings.quota_borrowing, ids=ids):
        wanted = Waiting(job.id, job.level, capable(job.queue, workers), job.needs, job.borrowed)
        target = victim(wanted, running)
        if target is None or not preemption.ask_to_yield(url, target, job.id):
            continue
        log.info("job %s asked to yield to job %s (%s)", target, job.id, job.level)
        asked.append((target, job.id))
        running = [replace(r, yielding_to=job.id) if r.id == target else r for r in running]
    return asked
