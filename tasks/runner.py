"""The frame every job runs in: claim it in SQL, run its body, record the outcome, then ack.

Bodies raise `JobInputError` for bad input: the job fails with that message and the worker goes
on. Any other exception also fails the job, with its type and message, never the worker; except
a device fault (`mxq.errors.device_fault`: a CUDA error, a lost provider), which is the device's:
the job goes back to its queue without using an attempt, and the worker takes its device out
(`take_out`) until the launcher's probe finds it healthy again.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from mxq.db import events, jobs
from mxq.db import fleet as beats
from mxq.db.chunks import fan_out
from mxq.db.fence import Fence
from mxq.db.jobs import Claim, Placement
from mxq.db.retry import DatabaseUnreachable, db_retry
from mxq.db.schema import utcnow
from mxq.db.sharing import preemption
from mxq.device import Device
from mxq.errors import DeviceFault, device_fault, first_line, reason, typed_line
from mxq.tasks.job_context import (
    FanOut,
    JobCancelled,
    JobContext,
    JobFailed,
    JobInputError,
    JobLost,
    JobPreempted,
    JobTimedOut,
    Outcome,
    context_of,
)
from mxq.tasks.middleware.admission import AdmitNext
from mxq.tasks.middleware.current_job import CurrentJob
from mxq.tasks.middleware.job_log import JobLog
from mxq.tasks.middleware.middleware import Middleware, Run
from mxq.tasks.middleware.parent import SettleParent
from mxq.workers.broker.app import app
from mxq.workers.broker.publish import Turn, publish
from mxq.workers.broker.queues import device_queue, pool_queues, worker_name
from mxq.workers.fleet import heartbeat, leases, suspects
from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT
from mxq.workers.jobs import admit
from mxq.workers.jobs.jobspecs import stored
from mxq.workers.settings import Settings, get_settings

log = logging.getLogger(__name__)

# A job whose device failed under it this many times fails: a fault that follows a job from
# device to device is the job's own (a kernel its model makes fail), and each one takes a device
# out until its probe.
MAX_DEVICE_FAULTS = 2


class Delivery(enum.StrEnum):
    """What one delivery of a job did that ran or handed it on (the task's return value, logged;
    a delivery that does not run its job returns its `Claim`)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"  # yielded at a checkpoint: queued again to resume
    LOST = "lost"  # the job was no longer this attempt's when it wrote
    DEFERRED = "deferred"  # its devices were busy: its message goes back to its queue
    REDIRECTED = "redirected"  # it reached the wrong device: sent to its own queue
    SPLIT = "split"  # fanned out into chunk jobs
    DEVICE_FAULT = "device fault"  # the device failed under it: queued again elsewhere


Body = Callable[[JobContext], Outcome | FanOut]
Admit = Callable[[JobContext], list[str] | None]

# Held by a device worker process while it runs a delivery (`job_task`): what its heartbeat
# thread frees while the device is leased (tasks.inference.device_memory) is
# freed only when no job uses it. The fleet benchmark's simulated workers run `run_job` without it.
DELIVERY = threading.Lock()


def placement(s: Settings) -> Placement:
    """Where a worker process of settings `s` runs: its worker name, node and device."""
    device = s.device or "cpu:0"
    spec = Device.parse(device)
    return Placement(worker=worker_name(s.node, spec.kind, spec.index), node=s.node, device=device)


# What runs around every run of a job, outside its body (`tasks/middleware/`). Their `after`s run in
# reverse: the heartbeat lets go of the job, then its parent is settled, then admission counts
# what is free (a parent still running would count against its owner's quota), and the job's
# log, recording from the first `before`, is flushed last with its attempt's end note.
MIDDLEWARE: tuple[Middleware, ...] = (JobLog(), AdmitNext(), SettleParent(), CurrentJob())


@dataclass(frozen=True)
class Worker:
    """Who runs a job: where, with which settings, beating with which heartbeat.

    A device worker process is one (`this_worker`); the fleet benchmark runs many in one
    process, each a simulated device, through this same frame."""

    at: Placement
    settings: Settings
    heartbeat: heartbeat.Heartbeat | None
    faults: list[str] = field(default_factory=list)  # its device failed under a job: why
    middleware: tuple[Middleware, ...] = MIDDLEWARE  # around each run


def this_worker() -> Worker:
    """This device worker process, as its settings (read here, at its edge) place it."""
    s = get_settings()
    return Worker(placement(s), s, heartbeat.current)


@db_retry
def _context(s: Settings, job_id: int, device: str) -> JobContext | Claim:
    """The job to run, or why this delivery of it is dropped without a claim."""
    row = jobs.job_row(s.database, job_id)
    if row is None:
        return Claim.MISSING
    cutoff = utcnow() - timedelta(seconds=s.heartbeat_ttl)
    if (verdict := jobs.unclaimable(row["status"], row["heartbeat_at"], cutoff)) is not None:
        return verdict
    return context_of(row, device, s)



def _defer(s: Settings, job: JobContext, why: str) -> Delivery:
    """Hand the message back to its queue for later (the job stays queued, no attempt used)."""
    log.info("job %s deferred: %s", job.id, why)
    time.sleep(s.defer_seconds)  # MXQ_DEFER_SECONDS: a deferred message waits before going back
    publish(s, job.id, job.kind, job.queue, patient=True, turn=_turn(job))
    return Delivery.DEFERRED


def _turn(job: JobContext) -> Turn:
    return Turn(job.priority, job.started)


def run_job(job_id: int, body: Body, admit: Admit | None = None,
            release: Callable[[JobContext], None] | None = None,
            worker: Worker | None = None) -> Delivery | Claim:
    """Run one delivery of a job on `worker` (default: this process's device worker): what it
    did, or the claim's verdict when it did not run the job."""
    w = worker or this_worker()
    s, at = w.settings, w.at
    job = _context(s, job_id, at.device)
    if isinstance(job, Claim):  # e.g. a late message of a job a dynamic batch took
        log.info("job %s not run here: %s", job_id, job)
        return job
    job.worker, job.node = at.worker, at.node
    if (elsewhere := _meant_for_another(at.node, job.parsed_device, job.queue)) is not None:
        return _redirect(s, job, elsewhere)
    if (held := _held_back(w, job)) is not None:
        return held
    if admit is not None:
        devices = admit(job)
        if devices is None:
            return _defer(s, job, "its devices are not free")
        job.devices = devices
    verdict = jobs.take(s.database, job_id, at, s.max_attempts, s.heartbeat_ttl)
    if not isinstance(verdict, Fence):
        if release is not None and verdict is not Claim.DUPLICATE:  # a live duplicate keeps them
            release(job)
        log.warning("job %s not run here: %s", job_id, verdict)
        return verdict
    job.fence, job.costs.claimed = verdict, time.perf_counter()
    job.clock_from = job.clock_from or utcnow()  # as the claim set it: this is its first start
    try:
        return _run(w, job, body)
    finally:
        if release is not None:
            release(job)


def _held_back(w: Worker, job: JobContext) -> Delivery | None:
    """The job deferred when its device is not this delivery's to use now: leased by another
    job's training, or to be probed first (a suspect of a training's fault)."""
    s, device = w.settings, w.at.device
    holder = leases.holders(s.broker, s.node, [device]).get(device)
    if holder not in (None, job.id):
        return _defer(s, job, f"{device} is leased by job {holder}")
    if (suspect := _probe_first(w)) is not None:
        return _defer(s, job, f"{device} is to be probed first: {suspect}")
    return None


def _meant_for_another(node: str, device: Device, queue: str) -> str | None:
    """The device queue a job belongs to when it is not this worker's own or one of its kind's
    pools (a duplicate message on the pool must not run a job asked for another device); else
    None."""
    if queue in (device_queue(node, device.kind, device.index), *pool_queues(device.kind)):
        return None
    return queue


def _redirect(s: Settings, job: JobContext, queue: str) -> Delivery:
    """Send a delivery that reached the wrong device to the job's own queue (no attempt used)."""
    log.warning("job %s not run here: it was asked for queue %s", job.id, queue)
    publish(s, job.id, job.kind, queue, patient=True, turn=_turn(job))
    return Delivery.REDIRECTED


# The claimed job each worker runs now, by worker name: what NVML's verdict, heard by the
# heartbeat's thread, queues again (`_gpu_fault`).
_RUNNING: dict[str, JobContext] = {}


def _run(w: Worker, job: JobContext, body: Body) -> Delivery:
    """Run the claimed job's body inside its worker's middleware, and record its outcome."""
    assert job.fence is not None  # set by the claim
    run = Run(job.id, job.parent_id, w.settings, w.heartbeat, job.fence.attempt, job.fence.worker,
              tuple(job.devices or [job.device]))
    started: list[Middleware] = []
    _RUNNING[w.at.worker] = job
    try:
        for layer in w.middleware:
            layer.before(run)
            started.append(layer)  # a `before` that raises: its own `after` is not called
        return _outcome_of(w, job, body)
    finally:
        _RUNNING.pop(w.at.worker, None)
        _after(tuple(started), run)  # every middleware whose `before` ran gets its `after`


def _after(middleware: tuple[Middleware, ...], run: Run) -> None:
    """Every middleware's `after`, in reverse order, each even when one before it raised; the first
    exception is raised once all ran."""
    first: Exception | None = None
    for layer in reversed(middleware):
        try:
            layer.after(run)
        except Exception as exc:
            log.exception("job %s: middleware %s failed after its run", run.job_id, type(layer).__name__)
            first = first or exc
    if first is not None:
        raise first


def _outcome_of(w: Worker, job: JobContext, body: Body) -> Delivery:
    s, fence = w.settings, job.fence
    assert fence is not None  # set by the claim
    try:
        return _record(s, job, fence, body(job))
    except (JobInputError, JobFailed, JobTimedOut) as exc:
        return _outcome(jobs.fail(s.database, job.id, str(exc), fence=fence), Delivery.FAILED, job)
    except JobCancelled as exc:
        return _outcome(jobs.mark_cancelled(s.database, fence, exc.samples), Delivery.CANCELLED, job)
    except JobPreempted as exc:
        return _yield(s, job, fence, exc.to)
    except JobLost as exc:
        log.warning("%s; this attempt (%s) stopped, its writes refused", exc, fence.attempt)
        return Delivery.LOST
    except Exception as exc:
        if device_fault(exc):
            return _device_failed(w, job, fence, exc)
        log.exception("job %s failed", job.id)
        return _outcome(jobs.fail(s.database, job.id, _unexpected(job, exc), fence=fence),
                        Delivery.FAILED, job)


def _unexpected(job: JobContext, exc: Exception) -> str:
    """What a job that failed on an unexpected exception records: an outage past the retry
    window says so itself, without a class name; running out of host memory anywhere (Python
    raises a bare MemoryError) says so, and where; anything else its type and first line."""
    if isinstance(exc, DatabaseUnreachable):
        return first_line(exc, 500)
    if isinstance(exc, MemoryError):
        said = f": {first_line(exc)}" if str(exc).strip() else ""
        return f"out of host memory on {', '.join(job.devices or [job.device])}{said}"
    return typed_line(exc)


def _yield(s: Settings, job: JobContext, fence: Fence, to: int) -> Delivery:
    """Queue the job again after it stopped for job `to` (a `preempted` event names it); it
    resumes from what it committed, ahead of the jobs of its level that never started."""
    if not preemption.yielded(s.database, fence, to):
        return _outcome(False, Delivery.PREEMPTED, job)
    events.record(s.database, job.id, events.PREEMPTED, f"yielded {', '.join(job.devices)} to job "
                  f"{to} at a checkpoint; queued again to resume there", to=to,
                  attempt=fence.attempt, devices=job.devices)
    publish(s, job.id, job.kind, job.queue, patient=True, turn=Turn(job.priority, started=True))
    return Delivery.PREEMPTED


def _device_failed(w: Worker, job: JobContext, fence: Fence, exc: Exception) -> Delivery:
    """The device failed under the job: queue the job again to resume on a healthy device (no
    attempt used; its `MAX_DEVICE_FAULTS`th fails it), and take the faulty device out: this
    worker's own, and each other device of the job that may be it (`_blame`)."""
    s = w.settings
    why = f"device fault on {', '.join(job.devices)} during job {job.id}: {reason(exc)}"
    log.error("%s", why)
    _blame(w, job, exc, why)
    requeued = jobs.device_faulted(s.database, fence, MAX_DEVICE_FAULTS)
    if requeued is None:
        return _outcome(False, Delivery.DEVICE_FAULT, job)
    if not requeued:
        failed = jobs.fail(s.database, job.id, f"{why} (its {MAX_DEVICE_FAULTS}th device fault: one "
                           "that follows a job from device to device is the job's own)", fence=fence)
        return _outcome(failed, Delivery.FAILED, job)
    events.record(s.database, job.id, events.DEVICE_FAULT, f"{why}; queued again to resume on a "
                  "healthy device, no attempt used", attempt=fence.attempt, devices=job.devices)
    publish(s, job.id, job.kind, job.queue, patient=True, turn=Turn(job.priority, started=True))
    return Delivery.DEVICE_FAULT


def _blame(w: Worker, job: JobContext, exc: Exception, why: str) -> None:
    """Take out the devices the fault may have come from: the one its error names, else every
    device of the job (a K-device training's error rarely says which). This worker's own goes
    out as the delivery ends (`take_out`); the others' workers each take theirs out before their
    next job or at their next idle beat (`workers.fleet.suspects`), so that all are probed before
    the job, queued again, can run on a faulty one."""
    named = exc.devices if isinstance(exc, DeviceFault) else ()
    blamed = list(named) or list(job.devices or [job.device])
    if w.at.device in blamed:
        w.faults.append(why)
    if others := [d for d in blamed if d != w.at.device]:
        suspects.suspect(w.settings.broker, w.at.node, others, why)
        log.error("job %s: %s to be probed before they take work", job.id, ", ".join(others))


def _probe_first(w: Worker) -> str | None:
    """Why this worker's device is to be probed before it takes a job (another device's training
    faulted on it), clearing that; the delivery then ends with the device taken out."""
    why = suspects.take(w.settings.broker, w.at.node, w.at.device)
    if why is not None:
        w.faults.append(f"{why} (one of its devices, probed before it takes work)")
    return why


def _probe_first_when_idle() -> None:
    """At an idle beat: a worker whose device is suspect goes out now, not at its next job."""
    s = get_settings()
    if s.device is None or not DELIVERY.acquire(blocking=False):  # a job runs: its start checks
        return
    try:
        w = this_worker()
        if _probe_first(w) is not None:
            take_out(w, w.faults[-1])
    finally:
        DELIVERY.release()


heartbeat.on_idle.append(_probe_first_when_idle)


def _gpu_fault(why: str) -> None:
    """From the heartbeat's thread, when NVML says this worker's GPU must go out (a critical
    Xid, a pending row remap, uncorrectable ECC errors) or the running job's batch has hung on it
    (`_hung`): an idle worker takes its device out; a running job goes back to its queue as after
    any device fault (no attempt used; fenced, so the attempt still running can write nothing
    after) and the device goes out at once, the process ending (a thread blocked in a device call
    cannot be stopped otherwise). A delivery between its claim and its body returns here: the
    next beat asks again."""
    w = this_worker()
    if DELIVERY.acquire(blocking=False):  # no delivery: nothing to queue again
        take_out(w, f"{w.at.device}: {why}")
    if (job := _RUNNING.get(w.at.worker)) is not None and job.fence is not None:
        _device_failed(w, job, job.fence, DeviceFault(why, (w.at.device,)))
        take_out(w, w.faults[-1])


heartbeat.on_fault.append(_gpu_fault)


def _hung() -> str | None:
    """At a busy beat: why this worker's device is taken for hung, when the batch its running job
    computes there has run past its bound (`JobContext.watch`), else None."""
    return next((why for job in list(_RUNNING.values()) if (why := job.watch.hung(job.device))),
                None)


heartbeat.checks.append(_hung)


def take_out(w: Worker, why: str) -> None:
    """Stop this worker process after its device failed mid-job: its row says why (`mxq devices`),
    and it exits as a worker that refused its device, so the launcher starts it again (its start
    check probing the device) only after MXQ_REPROBE_SECONDS. A CUDA error leaves the process's
    context unusable: only a new process can tell whether the device healed."""
    beats.refuse(w.settings.database, w.at.worker, why)
    print(f"{REFUSAL_PREFIX}{why}", file=sys.stderr, flush=True)
    os._exit(REFUSED_EXIT)


def _record(s: Settings, job: JobContext, fence: Fence, outcome: Outcome | FanOut) -> Delivery:
    if isinstance(outcome, FanOut):
        return _fan_out(s, job, outcome)
    done = jobs.succeed(s.database, fence, outcome.samples, outcome.seconds, outcome.result)
    return _outcome(done, Delivery.SUCCEEDED, job)


def _outcome(recorded: bool, state: Delivery, job: JobContext) -> Delivery:
    """`state`, or LOST when the job was no longer this attempt's when its outcome came."""
    if recorded:
        return state
    log.warning("job %s: outcome %s refused: the job is no longer this attempt's", job.id, state)
    return Delivery.LOST


def _fan_out(s: Settings, job: JobContext, split: FanOut) -> Delivery:
    """Create the chunk jobs (once, even on redelivery) and publish those not yet started; while
    admission is on (a quota or a share), hold them for the admitter instead (which runs as
    this job's frame ends), so that its owner's quota counts every chunk (two ran at once
    under a quota of one)."""
    held = admit.holding(s)
    children = fan_out(job.url, job.id, job.kind, [stored(c) for c in split.chunks],
                       split.queues or job.queue, split.requested or job.requested, held)
    for child_id, queued, queue in children:
        if queued:
            publish(s, child_id, job.kind, queue, patient=True, turn=Turn(job.priority))
    log.info("job %s split into %s chunks on %s", job.id, len(children),
             ",".join(sorted({queue for _, _, queue in children})))
    return Delivery.SPLIT


def job_task(kind: str, admit: Admit | None = None,
             release: Callable[[JobContext], None] | None = None) -> Callable[[Body], Body]:
    """Register `body` as the Celery task `mxq.<kind>`; its message carries only the job id.

    `admit` runs before the claim (a multi-device job leases its devices there: None defers
    the job), `release` after the job or a refused claim.
    """
    def register(body: Body) -> Body:
        def _task(job_id: int) -> Delivery | Claim:
            started = time.monotonic()
            worker = this_worker()
            with DELIVERY:
                state = run_job(int(job_id), body, admit, release, worker)
            log.info("job %s %s in %.2fs", job_id, state, time.monotonic() - started)
            if worker.faults:
                take_out(worker, worker.faults[-1])
            return state
        app.task(name=f"mxq.{kind}")(_task)  # Celery has no types: called, not a decorator
        return body
    return register
