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
from mxq.db.sharing import admission, preemption
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


def _room(settings: Settings, queues: set[str]) -> dict[str, int]:
    """queue -> how many more jobs the broker should hold for it (one per live capable device)."""
    workers = list_workers(settings.database, settings.heartbeat_ttl)
    waiting = admission.admitted_waiting(settings.database)
    return {q: max(1, len(capable(q, workers))) - waiting.get(q, 0) for q in queues}


def _fits(job: Held, room: dict[str, int]) -> bool:
    return job.level == HIGH or room[job.queue] > 0


def admit(settings: Settings) -> list[int]:
    """Release the held jobs that may go now, in fair order; their ids."""
    url = settings.database
    held = admission.held(url, LOOK)
    if not held:
        return []
    shares, room = admission.shares(url), _room(settings, {j.queue for j in held})
    usage = admission.usage(url, utcnow() - timedelta(seconds=WINDOW_SECONDS))
    released: list[int] = []
    while (job := next_held([j for j in held if _fits(j, room)], shares, usage)) is not None:
        held.remove(job)
        if _release(settings, job):
            usage.take(job)
            room[job.queue] -= 1
            released.append(job.id)
    if settings.quota_borrowing and held:
        released += _borrow(settings, held, shares, usage)
    if released:
        log.info("admitted %s", released)
    return released


def _release(settings: Settings, job: Held, borrowed: bool = False) -> bool:
    """Release and publish `job`; False when another admitter released it or it was cancelled."""
    route = admission.release(settings.database, job.id, borrowed)
    if route is None:
        return False
    publish(settings, job.id, route["kind"], route["queue"], patient=True,
            turn=Turn(route["priority"], route["started"]))
    return True


def _idle(settings: Settings, queues: set[str]) -> dict[str, int]:
    """queue -> its capable devices that run nothing and that no released job waits for."""
    url = settings.database
    workers = list_workers(url, settings.heartbeat_ttl)
    busy = frozenset().union(*(r.devices for r in preemption.running(url, settings.heartbeat_ttl)))
    waiting = admission.admitted_waiting(url)
    return {q: len(capable(q, workers) - busy) - waiting.get(q, 0) for q in queues}


def _borrow(settings: Settings, held: list[Held], shares: dict[str, Share], usage: Usage) -> list[int]:
    """Jobs beyond their owners' quotas onto devices idle beyond everyone's (no job within a
    quota is left that could go): borrowed, so preemptible and the first taken back."""
    idle = _idle(settings, {j.queue for j in held})
    unlimited = {owner: Share(s.weight) for owner, s in shares.items()}  # in fair order still
    borrowed: list[int] = []
    beyond = [j for j in held if over_quota(j, shares.get(j.owner, Share()), usage)]
    while (job := next_held([j for j in beyond if idle.get(j.queue, 0) >= j.needs], unlimited,
                            usage)) is not None:
        beyond.remove(job)
        held.remove(job)
        if _release(settings, job, borrowed=True):
            usage.take(job)
            idle[job.queue] -= job.needs
            borrowed.append(job.id)
    if borrowed:
        log.info("lent idle devices beyond their quotas to %s", borrowed)
    return borrowed


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
