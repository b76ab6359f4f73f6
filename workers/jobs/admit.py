"""Admission: which held jobs go to the broker now (fair shares and quotas, `mxq.shares`).

Jobs are held in SQL only while some user has a share or a quota (`admission.active`). Then a
submit writes its job held, and the admitter releases jobs in fair order, keeping about one job
waiting in the broker per device that could run it (so a device that frees finds work at once,
and the order among owners is decided here, not by the broker's first in, first out): after
every submit, at every job's end, and at every reconciler pass. A `high` job goes as soon as its
owner's quota allows. A job beyond its owner's quota stays held and says why (`reasons`).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from mxq.db.fleet import list_workers
from mxq.db.schema import utcnow
from mxq.db.sharing import admission
from mxq.priorities import HIGH
from mxq.shares import Held, Share, Usage, next_held, over_quota, quota_reason
from mxq.workers.broker.publish import Turn, publish
from mxq.workers.jobs.preempt import capable
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)
LOOK = 500  # held jobs considered per pass (the first ones, in the order workers take them)
WINDOW_SECONDS = 3600.0  # the recent use fair shares compare


def holding(settings: Settings) -> bool:
    """Whether a new job is held for admission (some user has a share or a quota)."""
    return admission.active(settings.database)


def _room(settings: Settings) -> dict[str, int]:
    """queue -> how many more jobs the broker should hold for it (one per live capable device)."""
    workers = list_workers(settings.database, settings.heartbeat_ttl)
    waiting = admission.admitted_waiting(settings.database)
    queues = {w["queue"] for w in workers} | set(waiting)
    return {q: max(1, len(capable(q, workers))) - waiting.get(q, 0) for q in queues}


def _fits(job: Held, room: dict[str, int]) -> bool:
    return job.level == HIGH or room.get(job.queue, 1) > 0


def admit(settings: Settings) -> list[int]:
    """Release the held jobs that may go now, in fair order; their ids."""
    url = settings.database
    held = admission.held(url, LOOK)
    if not held:
        return []
    shares, room = admission.shares(url), _room(settings)
    usage = admission.usage(url, utcnow() - timedelta(seconds=WINDOW_SECONDS))
    released: list[int] = []
    while (job := next_held([j for j in held if _fits(j, room)], shares, usage)) is not None:
        held.remove(job)
        route = admission.release(url, job.id)
        if route is None:  # another admitter released it, or it was cancelled
            continue
        publish(settings, job.id, route["kind"], route["queue"], patient=True,
                turn=Turn(route["priority"], route["started"]))
        usage.take(job)
        room[job.queue] = room.get(job.queue, 1) - 1
        released.append(job.id)
    if released:
        log.info("admitted %s", released)
    return released


def reasons(settings: Settings) -> dict[int, str]:
    """held job -> why it waits (its owner's quota, or its turn by fair share)."""
    url = settings.database
    shares = admission.shares(url)
    usage: Usage = admission.usage(url, utcnow() - timedelta(seconds=WINDOW_SECONDS))
    said: dict[int, str] = {}
    for job in admission.held(url, LOOK):
        share = shares.get(job.owner, Share())
        if over_quota(job, share, usage):
            said[job.id] = quota_reason(share, usage.devices.get(job.owner, 0))
        else:
            said[job.id] = (f"held: released by fair share as devices free (owner {job.owner}, "
                            f"weight {share.weight:g}, {usage.seconds.get(job.owner, 0.0):.0f} "
                            "device-seconds in the last hour)")
    return said


def admit_quietly(settings: Settings) -> None:
    """`admit` at a job's end, when jobs are held at all (one read of the users table when not),
    where a failure must not fail the job: logged, and the reconciler's next pass admits."""
    try:
        if holding(settings):
            admit(settings)
    except Exception:  # the caller's work is done; admission is retried every reconciler pass
        log.warning("admission failed; the reconciler will admit", exc_info=True)
