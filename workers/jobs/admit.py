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
from dataclasses import dataclass
from datetime import timedelta

from redis.exceptions import LockError

from mxq.db.fleet import list_workers
from mxq.db.schema import utcnow
from mxq.db.sharing import admission, preemption
from mxq.priorities import HIGH
from mxq.shares import Held, Share, Usage, next_held, over_quota, quota_reason
from mxq.workers.broker import redis_client
from mxq.workers.broker.publish import republish
from mxq.workers.jobs.preempt import capable
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)
# One admitter at a time: its lock in the broker, freed after LOCK_SECONDS by a pass that died
# holding it; a pass waits WAIT_SECONDS for it (the pass after the holder's sees what was held
# meanwhile), then leaves admitting to the reconciler.
LOCK = "mxq:admission"
LOCK_SECONDS = 60.0
WAIT_SECONDS = 15.0
LOOK = 500  # held jobs considered per pass (the first ones, in the order workers take them)
WINDOW_SECONDS = 3600.0  # the recent use fair shares compare


def holding(settings: Settings) -> bool:
    """Whether a new job is held for admission (some user has a share or a quota)."""
    return admission.active(settings.database)


@dataclass
class _Broker:
    """What the broker holds for each queue of the held jobs: the live devices that could run
    them, and the released jobs still waiting there for a worker (read once per pass, counted on
    as the pass releases more)."""

    capable: dict[str, frozenset[str]]
    waiting: dict[str, int]

    @classmethod
    def read(cls, settings: Settings, queues: set[str]) -> _Broker:
        workers = list_workers(settings.database, settings.heartbeat_ttl)
        return cls({q: capable(q, workers) for q in queues},
                   admission.admitted_waiting(settings.database))

    def room(self, queue: str) -> int:
        """How many more jobs the broker should hold for `queue` (one per capable device)."""
        return max(1, len(self.capable[queue])) - self.waiting.get(queue, 0)

    def fits(self, job: Held) -> bool:
        return job.level == HIGH or self.room(job.queue) > 0

    def took(self, job: Held) -> None:
        self.waiting[job.queue] = self.waiting.get(job.queue, 0) + 1


def _recent_usage(url: str) -> Usage:
    return admission.usage(url, utcnow() - timedelta(seconds=WINDOW_SECONDS))


def admit(settings: Settings) -> list[int]:
    """Release the held jobs that may go now, in fair order; their ids. One pass at a time over
    the whole stack (a lock in the broker): two passes that each read the owners' use before
    the other released a job would each release one for an owner one below its quota."""
    lock = redis_client.client(settings.broker).lock(LOCK, timeout=LOCK_SECONDS,
                                                     blocking_timeout=WAIT_SECONDS)
    if not lock.acquire():
        log.warning("admission: another pass held the lock %ss; the reconciler will admit",
                    WAIT_SECONDS)
        return []
    try:
        return _admit(settings)
    finally:
        try:
            lock.release()
        except LockError:  # held past LOCK_SECONDS: it expired, and may be another pass's now
            log.warning("admission: a pass outlasted its lock (%ss)", LOCK_SECONDS)


def _admit(settings: Settings) -> list[int]:
    url = settings.database
    held = admission.held(url, LOOK)
    if not held:
        return []
    shares, usage = admission.shares(url), _recent_usage(url)
    broker = _Broker.read(settings, {j.queue for j in held})
    released: list[int] = []
    while (job := next_held([j for j in held if broker.fits(j)], shares, usage)) is not None:
        held.remove(job)
        if _release(settings, job):
            usage.take(job)
            broker.took(job)
            released.append(job.id)
    if settings.quota_borrowing and held:
        released += _borrow(settings, held, shares, usage, broker)
    if released:
        log.info("admitted %s", released)
    return released


def _release(settings: Settings, job: Held, borrowed: bool = False) -> bool:
    """Release and publish `job`; False when another admitter released it or it was cancelled."""
    route = admission.release(settings.database, job.id, borrowed)
    if route is None:
        return False
    republish(settings, job.id, route)
    return True


def _borrow(settings: Settings, held: list[Held], shares: dict[str, Share], usage: Usage,
            broker: _Broker) -> list[int]:
    """Jobs beyond their owners' quotas onto devices idle beyond everyone's (no job within a
    quota is left that could go): borrowed, so preemptible and the first taken back."""
    busy = frozenset().union(*(r.devices for r in preemption.running(settings.database,
                                                                     settings.heartbeat_ttl)))
    idle = {q: len(devices - busy) - broker.waiting.get(q, 0) for q, devices in broker.capable.items()}
    unlimited = {owner: Share(s.weight) for owner, s in shares.items()}  # in fair order still
    borrowed: list[int] = []
    beyond = [j for j in held if over_quota(j, shares.get(j.owner, Share()), usage)]
    while (job := next_held([j for j in beyond if idle[j.queue] >= j.needs], unlimited,
                            usage)) is not None:
        beyond.remove(job)
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
    usage = _recent_usage(url)
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
