"""Whether a job's device still makes progress: the watchdog of a hung device.

A thread blocked in a device call (a forward pass a hung GPU never finishes, a CUDA sync) cannot
be interrupted, nor can it notice anything itself; another thread of the same process asks this
watch whether the call has run too long: a device worker's heartbeat for the batches its own
thread computes (`tasks.runner`), a training child's watchdog thread (`watch_in_thread`) for its
training's. Too long is MXQ_DEVICE_HANG_SECONDS, and never less than MXQ_DEVICE_HANG_FACTOR times
the slowest batch seen so far in the job (`hang_bound`), so a job whose batches are slow on a
slow device keeps its margin. The watch is armed only while device work runs (`begin` .. `end`):
time spent reading input, writing results or checkpoints is not the device's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def hang_bound(hang_seconds: float, factor: float, slowest: float) -> float:
    """How long a device call may run before its device is taken for hung: `hang_seconds`, or
    `factor` times the slowest batch of the job so far (`slowest` seconds) when that is longer."""
    return max(hang_seconds, factor * slowest)


class DeviceWatch:
    """The device progress of one job's attempt in this process: when its current batch began
    (None while no device work runs) and how long its slowest finished batch took.

    The working thread writes, the watching thread reads, without a lock: each is one attribute
    of a float (or None), which CPython reads and writes whole, and a reading one batch stale
    only moves the bound by that batch. A lock and a generator per batch cost a small model's
    job 3 microseconds a batch (about 1 % of an MLP's 4,000 batches a second)."""

    def __init__(self, hang_seconds: float, factor: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hang_seconds, self.factor, self.clock = hang_seconds, factor, clock
        self.slowest = 0.0
        self.batches = 0  # finished while armed
        self._since: float | None = None  # the current batch's start, while armed

    def begin(self) -> None:
        """Device work starts now: its first batch begins."""
        self._since = self.clock()

    def batch_done(self) -> None:
        """A batch finished on the device (its results came back): the next begins now."""
        now, since = self.clock(), self._since
        if since is not None:
            self.slowest = max(self.slowest, now - since)
            self.batches += 1
        self._since = now

    def end(self) -> None:
        """Device work stops (what follows is the host's: a write, a checkpoint)."""
        self._since = None

    def batch(self) -> _Batch:
        """One device call as a batch: armed while it runs, its time counted when it returns."""
        return _Batch(self)

    def bound(self) -> float:
        """How long the current batch may run (`hang_bound` of this job's slowest so far)."""
        return hang_bound(self.hang_seconds, self.factor, self.slowest)

    def hung(self, where: str) -> str | None:
        """Why the device `where` is taken for hung (its current batch ran past `bound`), else
        None; the line the job's `device-fault` event and the device's reason carry."""
        since, slowest, bound = self._since, self.slowest, self.bound()
        if since is None or (ran := self.clock() - since) <= bound:
            return None
        slow = f", {self.factor:g} times its slowest batch ({slowest:.2f} s)" if slowest else ""
        return (f"no batch finished on {where} for {ran:.0f} s (MXQ_DEVICE_HANG_SECONDS "
                f"{self.hang_seconds:g}{slow}): the device is taken out as hung")


class _Batch:
    """`DeviceWatch.batch`'s context: a class, not a generator, for its cost per batch."""

    __slots__ = ("watch",)

    def __init__(self, watch: DeviceWatch) -> None:
        self.watch = watch

    def __enter__(self) -> None:
        self.watch.begin()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.watch.batch_done()
        self.watch.end()


def watch_in_thread(watch: DeviceWatch, where: str, on_hang: Callable[[str], None],
                    interval: float) -> threading.Thread:
    """A daemon thread that asks `watch` every `interval` seconds and calls `on_hang` with why,
    once, when its device is hung; `on_hang` is expected to end the process (the thread blocked
    in the device call cannot be stopped any other way)."""
    def run() -> None:
        while (why := watch.hung(where)) is None:
            time.sleep(interval)
        log.error("%s", why)
        on_hang(why)

    thread = threading.Thread(target=run, name="mxq-device-watch", daemon=True)
    thread.start()
    return thread
