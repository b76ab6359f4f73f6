"""The reconciler: make SQL (the truth about jobs) and the broker agree again after a fault.

It runs in the schedule process every MXQ_RECONCILE_SECONDS (and once with `mxq reconcile`):
- a job `queued` in SQL whose message is in no queue and held by no worker (the broker lost
  it) is published again;
- a job `running` whose heartbeat is stale (its worker, or its whole node, died) and whose
  message is not waiting in a queue is requeued, or failed once its attempts are used up;
- a parent whose chunks have all finished but that was never closed is settled;
- a device lease whose holder job is over or dead is freed;
- a schedule fire whose tick died before it submitted its job gets its job;
- a job waiting for others (`--after`) whose jobs all succeeded is released, and one whose job
  failed, was cancelled or was removed fails (`mxq.workers.jobs.dependencies`);
- an unreadable queue item is moved to the dead-letter list, and the unacknowledged message of a
  job that is over (its ack was lost with a broker connection) is dropped.
Each pass reads every queue twice (`messages.look`: job ids picked out inside Redis, a page at a
time), so a pass over 100,000 queued jobs takes seconds without blocking the workers' Redis.
Every action is recorded on the job (`db.events`). A message published twice is harmless: the
claim in SQL runs each job once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from mxq.db import events, jobs, repair, schedules
from mxq.db.chunks import settle_parent
from mxq.db.fleet import list_workers
from mxq.db.records import JobRoute
from mxq.db.schema import utcnow
from mxq.status import FINISHED, JobStatus
from mxq.workers.broker.messages import UNACKED, UNACKED_INDEX, Held, look, move_aside
from mxq.workers.broker.publish import republish, requeue
from mxq.workers.broker.queues import CONTROL_QUEUE, all_pools
from mxq.workers.broker.redis_client import client
from mxq.workers.fleet import leases
from mxq.workers.jobs import admit, dependencies, preempt
from mxq.workers.schedules.fires import submit_fire
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)

# A job submitted less than this long ago may still be between its row and its message.
SUBMIT_GRACE_SECONDS = 10.0
# A fire's tick submits its job within a second; one older than this without a job lost it.
FIRE_GRACE_SECONDS = 60.0
# A queued job's message is unacknowledged only while a worker claims or defers it (a second at
# most); one held longer belongs to a consumer that lost its connection and will never run it.
# (Redis would hand it out again only after the visibility timeout, hours away.)
UNACKED_GRACE_SECONDS = 30.0


@dataclass
class Report:
    republished: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    settled: list[int] = field(default_factory=list)
    leases_freed: list[str] = field(default_factory=list)
    fires_submitted: list[int] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)  # the queue of each message moved aside
    stalled: list[int] = field(default_factory=list)  # failed: no progress for MXQ_STALL_SECONDS
    cancels_enforced: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    after_released: list[int] = field(default_factory=list)  # their --after jobs all succeeded
    after_failed: list[int] = field(default_factory=list)  # one of their --after jobs did not
    preemptions_asked: list[tuple[int, int]] = field(default_factory=list)  # (asked, for)

    def empty(self) -> bool:
        return not any(vars(self).values())


def _queued(settings: Settings) -> dict[int, JobRoute]:
    return repair.queued_before(settings.database, utcnow() - timedelta(seconds=SUBMIT_GRACE_SECONDS))


def _stale_running(settings: Settings) -> dict[int, JobRoute]:
    return repair.stale_running(settings.database, utcnow() - timedelta(seconds=settings.heartbeat_ttl))


def _of_finished(settings: Settings, held: dict[int, list[Held]]) -> dict[int, list[Held]]:
    """The long-held messages of jobs that are over: delivered on a connection that broke before
    the ack (a broker restart), Redis would hand them out again hours later, to be dropped unrun."""
    over = repair.statuses(settings.database, set(held) - _live(held))
    return {i: held[i] for i, status in over.items() if status in FINISHED}


def _live(held: dict[int, list[Held]]) -> set[int]:
    return {i for i, entries in held.items() if any(h.age < UNACKED_GRACE_SECONDS for h in entries)}


@dataclass
class Lost:
    """What the two looks found: queued jobs with no live message, stale running jobs with none
    waiting, the stale unacknowledged messages of both, and the unreadable queue items."""

    queued: dict[int, JobRoute] = field(default_factory=dict)
    dead: dict[int, JobRoute] = field(default_factory=dict)
    stale: dict[int, list[Held]] = field(default_factory=dict)
    unreadable: list[tuple[str, str, str]] = field(default_factory=list)


def lost_messages(settings: Settings, queues: set[str]) -> Lost:
    """Compare SQL with two looks at `queues` MXQ_RECONCILE_LOOK_SECONDS apart (a message is out of
    sight only for the instant a worker moves it from its queue to the unacked set, never in two
    looks); SQL is read again after them, so a job that moved on meanwhile is left alone.

    The first look also finds the unreadable items: each queue item is read twice a pass, no more.
    """
    queued, running = _queued(settings), _stale_running(settings)
    first = look(settings.broker, queues)
    if not queued and not running:
        return Lost(stale=_of_finished(settings, first.held), unreadable=first.unreadable)
    time.sleep(settings.reconcile_look_seconds)
    second = look(settings.broker, queues)
    seen = first.waiting | second.waiting | _live(first.held) | _live(second.held)
    lost = {i for i, status in repair.statuses(settings.database, set(queued) - seen).items()
            if status == JobStatus.QUEUED}
    dead = (set(running) - first.waiting - second.waiting) & set(_stale_running(settings))
    stale = {i: second.held[i] for i in lost | dead if i in second.held}
    stale.update(_of_finished(settings, second.held))
    return Lost({i: queued[i] for i in lost}, {i: running[i] for i in dead}, stale,
                first.unreadable)


def _drop_unacked(settings: Settings, stale: dict[int, list[Held]]) -> None:
    """Forget messages whose consumer is gone, so Redis does not hand them out hours later."""
    tags = [h.tag for entries in stale.values() for h in entries]
    if tags:
        pipe = client(settings.broker).pipeline(transaction=True)
        pipe.zrem(UNACKED_INDEX, *tags)
        pipe.hdel(UNACKED, *tags)
        pipe.execute()


def _republish(settings: Settings, lost: dict[int, JobRoute], stale: dict[int, list[Held]],
               report: Report) -> None:
    for job_id in sorted(lost):
        queue = lost[job_id]["queue"]
        republish(settings, job_id, lost[job_id])
        why = (f"its message was held unacknowledged for {max(h.age for h in stale[job_id]):.0f}s "
               "by a consumer that lost its connection" if job_id in stale
               else "its message was gone from the broker")
        events.record(settings.database, job_id, events.REPUBLISHED,
                      f"{why}; published again to {queue}")
        report.republished.append(job_id)


def _requeue_dead(settings: Settings, dead: dict[int, JobRoute], report: Report) -> None:
    stale_before = utcnow() - timedelta(seconds=settings.heartbeat_ttl)
    for job_id in sorted(dead):
        kind, queue = dead[job_id]["kind"], dead[job_id]["queue"]
        why = f"its heartbeat is older than {settings.heartbeat_ttl:g}s and no worker holds it"
        outcome = requeue(settings, job_id, kind, queue, why, stale_before)
        if outcome is not None:
            (report.requeued if outcome else report.failed).append(job_id)


def _settle_parents(settings: Settings, report: Report) -> None:
    for parent in repair.running_parents(settings.database):
        if settle_parent(settings.database, parent,
                              "every chunk had finished; the parent was closed by the reconciler"):
            report.settled.append(parent)


def _free_leases(settings: Settings, report: Report) -> None:
    """Free leases whose holder is over or gone.

    A running holder keeps its leases even with a stale heartbeat: its next attempt re-takes
    them before its claim (the admit hook), so they expire by their TTL or pass to it."""
    r = client(settings.broker)
    held = {k: v for k in r.scan_iter(match="mxq:lease:*", count=500) if (v := r.get(k))}
    if not held:
        return
    state = repair.statuses(settings.database, {int(v) for v in held.values() if v.isdigit()})
    for k, v in held.items():
        status = state.get(int(v)) if v.isdigit() else None
        if (status is None or status in FINISHED) and r.eval(leases.RELEASE_SCRIPT, 1, k, v):
            device = ":".join(k.rsplit(":", 2)[1:])
            if status is not None:
                events.record(settings.database, int(v), events.LEASE_FREED,
                              f"lease on {device} freed: its holder is {status}")
            report.leases_freed.append(k)


def _resubmit_fires(settings: Settings, report: Report) -> None:
    for lost in repair.lost_fires(settings.database, utcnow() - timedelta(seconds=FIRE_GRACE_SECONDS)):
        fire_id, name = lost["fire_id"], lost["schedule"]
        job_id = submit_fire(settings, schedules.get(settings.database, name), fire_id)
        if job_id is not None:
            events.record(settings.database, job_id, events.RESUBMITTED,
                          f"fire {fire_id} of schedule {name!r} had no job (its tick died); "
                          "submitted by the reconciler")
        report.fires_submitted.append(fire_id)


def _end_stuck(settings: Settings, report: Report) -> None:
    """Fail running jobs that made no progress for MXQ_STALL_SECONDS and cancel those that did not
    heed a cancel within MXQ_CANCEL_GRACE_SECONDS; their workers, still in them, then exit
    (mxq.workers.fleet.heartbeat) and the launcher starts fresh ones."""
    now = utcnow()
    stalled, ignored = jobs.stuck(settings.database, now - timedelta(seconds=settings.stall_seconds),
                                  now - timedelta(seconds=settings.cancel_grace_seconds))
    for job_id in stalled:
        reason = (f"made no progress for {settings.stall_seconds:g} s (MXQ_STALL_SECONDS) although "
                  "its worker was alive: failed by the reconciler")
        if jobs.end_stuck(settings.database, job_id, JobStatus.FAILED, reason):
            report.stalled.append(job_id)
    for job_id in ignored:
        reason = (f"cancelled by the reconciler: it did not stop within "
                  f"{settings.cancel_grace_seconds:g} s of its cancel (MXQ_CANCEL_GRACE_SECONDS)")
        if jobs.end_stuck(settings.database, job_id, JobStatus.CANCELLED, reason):
            report.cancels_enforced.append(job_id)


def _known_queues(settings: Settings) -> set[str]:
    """Every queue mxq routes to: each device worker's, each queued or running job's (its worker
    may be gone), the pools, the control queue."""
    workers = list_workers(settings.database, settings.heartbeat_ttl)
    return ({w["queue"] for w in workers} | repair.live_queues(settings.database)
            | {*all_pools(), CONTROL_QUEUE})


def reconcile(settings: Settings) -> Report:
    """One pass over every check; returns what it did."""
    report = Report()
    found = lost_messages(settings, _known_queues(settings))
    report.dead_lettered = move_aside(settings.broker, found.unreadable)
    _drop_unacked(settings, found.stale)
    _republish(settings, found.queued, found.stale, report)
    _requeue_dead(settings, found.dead, report)
    _settle_parents(settings, report)
    _free_leases(settings, report)
    _resubmit_fires(settings, report)
    _end_stuck(settings, report)
    settled = dependencies.settle(settings)  # before admission: a wait that ends joins its turn
    report.after_released, report.after_failed = settled.released, settled.failed
    report.admitted = admit.admit(settings)  # held jobs their owners' quotas and shares allow now
    report.preemptions_asked = preempt.ask(settings)  # for the jobs that still wait
    if not report.empty():
        log.warning("reconciled: %s", report)
    return report
