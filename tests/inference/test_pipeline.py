"""The streaming job's side threads (`tasks/inference/pipeline.py`): the prefetch thread reads
ahead in order and hands its failure to the job; the writer writes in order and hands its
failure over at the next submit or at close; on a CPU device the reads and the output files'
writes run at idle priority (`yield_cores`), taking only the time the engine's threads leave on
the cores, and SQL at the default one."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from mxq.tasks.inference.pipeline import BackgroundWriter, at_idle_priority, prefetch, yield_cores

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _policy_then(items: list[int], seen: list[int]) -> Iterator[int]:
    seen.append(os.sched_getscheduler(0))  # on the producing thread
    yield from items


@linux_only
def test_prefetch_reads_ahead_in_order_at_idle_priority_and_the_job_keeps_its_own() -> None:
    seen: list[int] = []
    before = os.sched_getscheduler(0)
    assert list(prefetch(_policy_then(list(range(50)), seen), idle=True)) == list(range(50))
    assert seen == [os.SCHED_IDLE]
    assert os.sched_getscheduler(0) == before != os.SCHED_IDLE
    seen.clear()
    assert list(prefetch(_policy_then([1, 2], seen))) == [1, 2]
    assert seen == [before]  # without `idle`, the default policy


def test_prefetch_hands_the_readers_failure_to_the_job() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("input x is truncated")

    got = []
    with pytest.raises(ValueError, match="truncated"):
        for item in prefetch(failing(), idle=True):
            got.append(item)
    assert got == [1]


def test_the_writer_writes_in_order_and_hands_over_its_failure() -> None:
    written: list[int] = []

    def write(item: int) -> None:
        if item == 3:
            raise OSError("disk full")
        written.append(item)

    writer = BackgroundWriter(write, in_flight=1)
    for i in range(3):
        writer.submit(i)
    writer.drain()
    assert written == [0, 1, 2]
    writer.submit(3)
    with pytest.raises(OSError, match="disk full"):
        writer.close()


@linux_only
def test_file_writes_go_to_an_idle_thread_and_the_writer_keeps_its_priority() -> None:
    """The writer commits to SQL at the default priority (an idle thread holding SQLite's write
    lock would hold up every other writer); the files it writes before, at idle priority."""
    before = os.sched_getscheduler(0)
    assert at_idle_priority(os.sched_getscheduler, 0) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == before != os.SCHED_IDLE
    with pytest.raises(OSError, match="disk full"):
        at_idle_priority(_fail, "disk full")


def _fail(why: str) -> None:
    raise OSError(why)


def _count_for(seconds: float, core: int, idle: bool) -> int:
    """How far a thread pinned to `core` counts in `seconds`, idle or at the default policy."""
    counted = [0]

    def count() -> None:
        os.sched_setaffinity(0, {core})
        if idle:
            yield_cores()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            counted[0] += 1

    thread = threading.Thread(target=count)
    thread.start()
    thread.join()
    return counted[0]


@linux_only
@pytest.mark.slow  # a CPU share: measured, so kept out of the fast tier (issue 46)
def test_an_idle_side_thread_gives_its_core_to_the_compute() -> None:
    """A busy process on the same core stands for the engine's threads: beside it, a thread at
    the default policy gets about half the core, an idle one next to nothing. (The fast tier
    checks the policy each side thread runs at, above; this checks what Linux makes of it.)"""
    core = sorted(os.sched_getaffinity(0))[-1]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                           preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    try:
        time.sleep(0.2)  # running
        fair = _count_for(0.5, core, idle=False)
        idle = _count_for(0.5, core, idle=True)
    finally:
        hog.kill()
        hog.wait()
    assert idle < fair / 5, f"idle thread counted {idle:,}, a default one {fair:,}"


@linux_only
def test_a_forked_child_gets_an_idle_thread_of_its_own() -> None:
    """A process forked after the helper started has no such thread: it makes its own."""
    at_idle_priority(os.getpid)  # the helper started here
    read, write = os.pipe()
    answered: list[int] = []
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        ok = at_idle_priority(os.sched_getscheduler, 0) == os.SCHED_IDLE
        os.write(write, b"y" if ok else b"n")
        os._exit(0)
    os.close(write)
    try:
        answered, _, _ = select.select([read], [], [], 20)
        assert answered, "the child's work never ran: it waited on the parent's thread"
        assert os.read(read, 1) == b"y"
    finally:
        if not answered:
            os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(read)
