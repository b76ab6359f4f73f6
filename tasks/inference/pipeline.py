"""Overlap for streaming jobs: read the next batch and write the last results on side threads
while the device computes. Only the job's own thread talks to MXNet (its engine is not safe for
several client threads); the side threads do NumPy reads and SQL writes, which release the GIL.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = object()  # put after the last item


def prefetch(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Yield `items`, produced `depth` ahead on a thread; its exceptions surface here."""
    # (True, item or _DONE) or (False, the exception the producer met)
    q: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put((True, item))
        except BaseException as exc:  # handed to the consumer, raised there
            q.put((False, exc))
            return
        q.put((True, _DONE))

    threading.Thread(target=produce, name="mxq-prefetch", daemon=True).start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        while not q.empty():  # unblock a producer waiting on a full queue
            q.get_nowait()


class BackgroundWriter:
    """Runs `write(item)` for each submitted item on one thread, in order.

    At most `in_flight` items are submitted and not yet written: `submit` waits for the writer
    beyond that. With 1, the caller computes the next item while the last one is written, and
    never further ahead, which bounds what a killed job loses to those two.
    `close()` waits for everything to be written and re-raises the first failure, so a job
    never reports success for results that were not stored.
    """

    def __init__(self, write: Callable[[Any], None], in_flight: int = 4) -> None:
        self._write = write
        self._q: queue.Queue[Any] = queue.Queue()  # items for `write`, then _DONE
        self._slots = threading.Semaphore(in_flight)
        self._in_flight = in_flight
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mxq-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not _DONE:
            if self._error is None:
                try:
                    self._write(item)
                except BaseException as exc:
                    self._error = exc
            self._slots.release()

    def submit(self, item: Any) -> None:
        if self._error is not None:
            raise self._error
        self._slots.acquire()
        self._q.put(item)

    def drain(self) -> None:
        """Wait until everything submitted is written (re-raising a failure); it takes more after."""
        for _ in range(self._in_flight):
            self._slots.acquire()
        for _ in range(self._in_flight):
            self._slots.release()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._q.put(_DONE)
        self._thread.join()
        if self._error is not None:
            raise self._error
