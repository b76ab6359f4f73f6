"""Overlap for streaming jobs: read the next batch and write the last results on side threads
while the device computes. Only the job's own thread talks to MXNet (its engine is not safe for
several client threads); the side threads do NumPy reads and SQL writes, which release the GIL.

On a CPU device the engine's own threads are the compute, on every core of the worker: there
the reads and the output files' writes run at idle priority (`yield_cores`), taking the time a
core would otherwise idle. At the same priority each of their wake-ups took a core from one of
the engine's threads in the middle of an operator, and the others waited for it: a small model's
job ran at 0.83-0.88 of its bare loop, 0.89-0.94 with them yielding (bench engines, MLP). SQL
writes stay at the default priority (`at_idle_priority` takes only lock-free work): an idle
thread holding SQLite's write lock, kept off its core by busy threads, would hold up every
other writer.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")
_idle: ThreadPoolExecutor | None = None  # this process's idle-priority helper (`at_idle_priority`)
_idle_made = threading.Lock()


def _forget_idle() -> None:
    """In a forked child: the parent's helper thread does not exist here."""
    global _idle, _idle_made
    _idle, _idle_made = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_idle)


def yield_cores() -> None:
    """Run the calling thread only where a core would otherwise idle (Linux's SCHED_IDLE, for
    this thread alone). It never starves the job: when the compute thread waits for it, that
    core idles, and it runs. Elsewhere, or where it is refused, the thread keeps its priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def at_idle_priority(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`work(*args)` on this process's idle-priority thread (`yield_cores`), waited for: only for
    work that takes no lock another thread may wait on (file writes, not SQL). A thread cannot
    leave idle priority again without privilege, so such work goes to a thread of its own."""
    global _idle
    with _idle_made:
        if _idle is None:
            _idle = ThreadPoolExecutor(1, thread_name_prefix="mxq-idle", initializer=yield_cores)
    return _idle.submit(work, *args, **kwargs).result()


def prefetch(items: Iterator[T], depth: int = 2, idle: bool = False) -> Iterator[T]:
    """Yield `items`, produced `depth` ahead on a thread (at idle priority with `idle`:
    `yield_cores`); its exceptions surface here."""
    # (item,), the exception the producer met, or None after the last item
    q: queue.Queue[tuple[T] | BaseException | None] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        if idle:
            yield_cores()
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put((item,))
        except BaseException as exc:  # handed to the consumer, raised there
            q.put(exc)
            return
        q.put(None)

    threading.Thread(target=produce, name="mxq-prefetch", daemon=True).start()
    try:
        while True:
            got = q.get()
            if isinstance(got, BaseException):
                raise got
            if got is None:
                return
            yield got[0]
    finally:
        stop.set()
        while not q.empty():  # unblock a producer waiting on a full queue
            q.get_nowait()


class BackgroundWriter(Generic[T]):
    """Runs `write(item)` for each submitted item on one thread, in order.

    At most `in_flight` items are submitted and not yet written: `submit` waits for the writer
    beyond that. With 1, the caller computes the next item while the last one is written, and
    never further ahead, which bounds what a killed job loses to those two.
    `close()` waits for everything to be written and re-raises the first failure, so a job
    never reports success for results that were not stored.
    """

    def __init__(self, write: Callable[[T], None], in_flight: int = 4) -> None:
        self._write = write
        self._q: queue.Queue[tuple[T] | None] = queue.Queue()  # (item,) for `write`, then None
        self._slots = threading.Semaphore(in_flight)
        self._in_flight = in_flight
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mxq-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            if self._error is None:
                try:
                    self._write(item[0])
                except BaseException as exc:
                    self._error = exc
            self._slots.release()

    def submit(self, item: T) -> None:
        if self._error is not None:
            raise self._error
        self._slots.acquire()
        self._q.put((item,))

    def drain(self) -> None:
        """Wait until everything submitted is written (re-raising a failure); it takes more after."""
        for _ in range(self._in_flight):
            self._slots.acquire()
        for _ in range(self._in_flight):
            self._slots.release()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
