"""Why each waiting job waits, in the order workers take them: the queue view of `mxq queue`,
the dashboard and `GET /api/v1/queue`.

A job waits for one of: the jobs it waits for (`--after`), its owner's quota or fair share, no
live worker takes its queue (no capable device; or the devices that would are out, their worker
having refused them, and it runs when one passes its check again), jobs that run first on the
devices it could use (a higher priority, or earlier), or those devices being busy (and whether a
job there was asked to yield to it).
"""

from __future__ import annotations

from mxq.db.fleet import list_workers, out_note
from mxq.db.records import QueuedJob, QueueEntry, WorkerRecord
from mxq.db.reports import queue
from mxq.db.sharing import preemption
from mxq.device import Device
from mxq.priorities import Running, Waiting
from mxq.workers.broker.queues import pool_of
from mxq.workers.jobs import admit, dependencies
from mxq.workers.jobs.preempt import capable
from mxq.workers.settings import Settings

SHOWN_OUT = 3  # the out devices a job's reason names, at most


def _takes(worker: WorkerRecord, queue: str) -> bool:
    """Whether `worker` would consume `queue` when live (`preempt.capable`'s rule)."""
    pool = pool_of(queue)
    if pool is None:
        return worker["queue"] == queue
    kind, engine = pool
    return Device.parse(worker["device"]).kind == kind and (engine is None or engine in worker["engines"])


def _waits_for_out(queue: str, workers: list[WorkerRecord], node: str) -> str | None:
    """For a job no live worker takes: the devices that would, which are out (their worker
    refused them: a failed start check, a fault during a job), since when and why; None when
    no such device."""
    out = [w for w in workers if w["health"] == "out" and _takes(w, queue)]
    if not out:
        return None
    named = [(w["device"] if w["node"] == node else f"{w['device']}@{w['node']}")
             + f", {out_note(w['out_reason'], w['out_since'])}" for w in out[:SHOWN_OUT]]
    more = f"; and {len(out) - SHOWN_OUT} more out" if len(out) > SHOWN_OUT else ""
    when = "the device passes" if len(out) == 1 else "one of them passes"
    return f"waits for {'; '.join(named)}{more}; it runs when {when} its check again"


def _why(job: QueuedJob, devices: frozenset[str], ahead: int, running: list[Running],
         held: dict[int, str], out: str | None = None) -> str:
    if job["held"]:
        return held.get(job["id"], "held: admitted later by its owner's quota and fair share")
    if not devices:
        return out or f"no capable device: no live worker takes its queue {job['queue']}"
    if ahead:
        runs = "jobs that run" if ahead > 1 else "job that runs"
        return f"behind {ahead} {runs} first on the devices it could use"
    return _next_why(job, devices, running)


def _next_why(job: QueuedJob, devices: frozenset[str], running: list[Running]) -> str:
    """Why the next job on its devices waits: a job yields to it, a device is free, or its
    devices are busy (and whether any of their jobs may yield to it)."""
    if (asked := next((r for r in running if r.yielding_to == job["id"]), None)) is not None:
        return f"next: job {asked.id} yields to it at its next checkpoint"
    busy = frozenset().union(*(r.devices for r in running))
    if devices - busy:
        return "next: a device that can run it is free"
    wanted = Waiting(job["id"], job["priority"], devices)
    lower = any(r.devices & devices and r.may_yield_to(wanted) for r in running)
    return (f"next, priority {job['priority']}: its {len(devices)} device"
            f"{'s are' if len(devices) > 1 else ' is'} busy"
            + ("" if lower else "; none of their jobs may yield to it"))


def queue_view(settings: Settings, limit: int = 100) -> list[QueueEntry]:
    """The first `limit` waiting jobs, each with its position and why it waits."""
    url = settings.database
    workers = list_workers(url, settings.heartbeat_ttl)
    running = preemption.running(url, settings.heartbeat_ttl)
    waiting = queue.waiting(url, limit)
    held = ({**admit.reasons(settings), **dependencies.reasons(settings)}
            if any(j["held"] for j in waiting) else {})
    seen: list[frozenset[str]] = []  # the capable devices of each job before this one
    entries: list[QueueEntry] = []
    for position, job in enumerate(waiting, start=1):
        devices = capable(job["queue"], workers)
        ahead = sum(1 for earlier in seen if earlier & devices) if not job["held"] else 0
        out = None if devices else _waits_for_out(job["queue"], workers, settings.node)
        entries.append({**job, "position": position,
                        "why": _why(job, devices, ahead, running, held, out)})
        if not job["held"]:
            seen.append(devices)
    return entries
