"""The heartbeat a device worker process writes: it is how routing knows the device is live.

Started on Celery's `worker_ready` (the worker consumes from then on) and cleared on shutdown;
`mxq.workers.celery` connects `start` and `stop` to those signals, and `refuse_unclear` to
`worker_init`. A thread keeps beating while the solo pool's main thread runs a long job.
A GPU worker's beat also reads its GPU through NVML (`mxq.workers.fleet.nvml`), stores what it
read in its row's info (`nvml`) when it changed, and hands a reason NVML gives to take the
device out to the task layer (`on_fault`); so does the watchdog of a hung device (`checks`), the
beat being a thread that is not the one blocked in the device call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from mxq.db import fleet
from mxq.device import Device
from mxq.json_types import JsonObject
from mxq.workers.broker.queues import device_queue, worker_name
from mxq.workers.fleet import nvml
from mxq.workers.hardware.devices import engines_for
from mxq.workers.hardware.start_check import refuse
from mxq.workers.settings import get_settings

log = logging.getLogger(__name__)


# The exit status of a worker that left a job taken from it (the launcher restarts it).
STUCK_EXIT = 75

# Called at each beat while the worker runs no job: the task layer adds what an idle worker does
# on its own (tasks.inference.device_memory gives back device memory while its device is leased).
on_idle: list[Callable[[], None]] = []
# Called with why when NVML says the worker's GPU must go out (`mxq.workers.fleet.gpu_health`):
# the task layer takes it out as a device fault, the job it runs queued again without an attempt
# (tasks.runner). Such a hook ends the process; one that returns is asked again at the next beat.
on_fault: list[Callable[[str], None]] = []
# Asked at each beat while the worker runs a job: why its device must go out now, else None (the
# task layer's watchdog: a batch that has run too long on a hung device, `hang_watch`). A reason
# goes to `on_fault` as NVML's does.
checks: list[Callable[[], str | None]] = []


class Heartbeat:
    """Beats for the worker and its current job; and ends the worker when that job was taken
    from it (failed for no progress, or cancelled by the reconciler) while its thread stays in it
    longer than `stuck_after` seconds: a read blocked for good frees its device only so."""

    def __init__(self, url: str, name: str, interval: float, stuck_after: float = 120.0,
                 gpu: nvml.Nvml | None = None, written: JsonObject | None = None) -> None:
        self.url, self.name, self.interval, self.stuck_after = url, name, interval, stuck_after
        self.gpu = gpu
        self._written = written  # NVML's reading as last stored (the registration's, at first)
        self._faulting = threading.Lock()  # one hand-over to `on_fault` at a time
        self.current_job: int | None = None
        self._lost: tuple[int, float] | None = None  # (job, when it was first seen not ours)
        self._stop = threading.Event()
        self._idling = threading.Lock()  # the idle hooks run one pass at a time
        self._thread = threading.Thread(target=self._run, name="mxq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat(self) -> None:
        job = self.current_job
        reading = self._read_gpu()
        changed = reading if reading != self._written else None
        ours = fleet.beat(self.url, self.name, job, changed)
        self._written = reading or self._written
        self._hand_fault(job is not None)
        if job is None and self._idling.acquire(blocking=False):
            # In a thread of its own: a hook blocked on a broker that does not answer (paused,
            # partitioned) must never hold the beats back, or the worker would look dead.
            threading.Thread(target=self._idle_once, name="mxq-idle", daemon=True).start()
        if ours or job is None:
            self._lost = None
            return
        if self._lost is None or self._lost[0] != job:
            self._lost = (job, time.monotonic())
        elif time.monotonic() - self._lost[1] > self.stuck_after:
            log.error("job %s is no longer this worker's (see `mxq job %s`) and the worker has "
                      "not come back from it in %.0f s (MXQ_CANCEL_GRACE_SECONDS): exiting so "
                      "that the launcher starts a fresh worker", job, job, self.stuck_after)
            os._exit(STUCK_EXIT)

    def _read_gpu(self) -> JsonObject | None:
        """What NVML says of the GPU now; None without NVML. A reader that breaks (a pynvml this
        code does not know) is dropped, said once, and never costs the beat."""
        if self.gpu is None:
            return None
        try:
            return self.gpu.read()
        except Exception:
            log.exception("NVML: reading %s failed; not read again by this worker", self.gpu.label)
            self.gpu = None
            return None

    def _hand_fault(self, busy: bool) -> None:
        """NVML, or while a job runs (`busy`) a check, gave a reason to take the device out: the
        task layer's hooks, in a thread of their own (a broker that does not answer must not hold
        the beats back)."""
        why = self.gpu.fault if self.gpu is not None else None
        if not why and busy:
            why = next((said for check in checks if (said := check())), None)
        if why and self._faulting.acquire(blocking=False):
            threading.Thread(target=self._fault, args=(why,), name="mxq-gpu-fault", daemon=True).start()

    def _fault(self, why: str) -> None:
        try:
            for hook in on_fault:
                hook(why)
            log.error("%s: %s (no hook took the device out yet)", self.name, why)
        except Exception:
            log.exception("taking the device out failed (%s); asking again at the next beat", why)
        finally:
            self._faulting.release()

    def _idle_once(self) -> None:
        try:
            self._idle()
        finally:
            self._idling.release()

    @staticmethod
    def _idle() -> None:
        """The idle hooks; one that fails (the broker away) must not cost the beat."""
        for hook in on_idle:
            try:
                hook()
            except Exception as exc:
                log.warning("idle hook %s failed: %s", getattr(hook, "__name__", hook), exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception:  # a database blip must not kill the heartbeat
                log.exception("heartbeat failed; retrying in %.1fs", self.interval)

    def stop(self) -> None:
        self._stop.set()
        fleet.mark_dead(self.url, self.name)


current: Heartbeat | None = None


def start(**_: object) -> None:
    """At `worker_ready`: register the device's worker row and start beating."""
    global current
    s = get_settings()
    if s.device is None:  # a worker started by hand, not by the launcher: no device to announce
        return
    spec = Device.parse(s.device)
    name = worker_name(s.node, spec.kind, spec.index)
    gpu = nvml.open_gpu(spec.kind, s.cuda_visible_devices, s.device)
    reading = gpu.read() if gpu is not None else None
    fleet.register(s.database, name, s.node, s.device, device_queue(s.node, spec.kind, spec.index),
                   os.getpid(), {}, engines=engines_for(spec.kind, s.mxnet_unusable), nvml=reading)
    current = Heartbeat(s.database, name, s.heartbeat_seconds, s.cancel_grace_seconds, gpu, reading)
    current.start()
    log.info("%s is live on %s", name, s.device)


def stop(**_: object) -> None:
    """At `worker_shutdown`: stop beating and mark the worker dead."""
    if current is not None:
        current.stop()


def refuse_unclear(**_: object) -> None:
    """At `worker_init`, before consuming: a GPU NVML says is not clear (a row remap or retired
    pages pending, uncorrectable ECC errors) is refused, so the launcher's probe cannot return it
    to service on a small matmul it may well pass; it is probed again later, as any refusal."""
    s = get_settings()
    if s.device is None:
        return
    gpu = nvml.open_gpu(Device.parse(s.device).kind, s.cuda_visible_devices, s.device)
    why = gpu.sticky() if gpu is not None else None
    if why:
        refuse(f"worker for {s.device}: {why}; it stays out until NVML says it is clear")
