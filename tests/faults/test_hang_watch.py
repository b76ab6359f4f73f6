"""The watchdog of a hung device, unit by unit (issue 60, item 3): the bound a batch may run (the
setting, or a multiple of the job's slowest batch), the watch armed only around device work, the
heartbeat handing a check's reason on as NVML's, and a start check bounded in time. The whole
path through real workers is test_device_hang.py."""

from __future__ import annotations

import threading

import pytest

from mxq.workers.fleet import heartbeat
from mxq.workers.fleet.hang_watch import DeviceWatch, hang_bound
from mxq.workers.hardware.start_check import within


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_bound_is_the_setting_or_a_multiple_of_the_slowest_batch() -> None:
    assert hang_bound(300, 10, 0.0) == 300
    assert hang_bound(300, 10, 29.9) == 300
    assert hang_bound(300, 10, 45.0) == 450
    assert hang_bound(5, 3, 4.0) == 12


def test_a_batch_past_the_bound_is_hung_and_one_within_it_is_not() -> None:
    clock = Clock()
    watch = DeviceWatch(30, 10, clock)
    assert watch.hung("cpu:0") is None  # not armed: no device work runs
    watch.begin()
    clock.now += 30
    assert watch.hung("cpu:0") is None  # at the bound, not past it
    clock.now += 1
    said = watch.hung("cpu:0")
    assert said == ("no batch finished on cpu:0 for 31 s (MXQ_DEVICE_HANG_SECONDS 30): the device "
                    "is taken out as hung")


def test_the_slowest_batch_so_far_widens_the_bound() -> None:
    clock = Clock()
    watch = DeviceWatch(30, 10, clock)
    watch.begin()
    clock.now += 2
    watch.batch_done()
    clock.now += 6  # a slow batch: the bound becomes 60 s
    watch.batch_done()
    assert (watch.slowest, watch.batches, watch.bound()) == (6, 2, 60)
    clock.now += 59
    assert watch.hung("gpu:1") is None  # past MXQ_DEVICE_HANG_SECONDS, within 10 slowest batches
    clock.now += 2
    said = watch.hung("gpu:1")
    assert said is not None and said.startswith("no batch finished on gpu:1 for 61 s (")
    assert "10 times its slowest batch (6.00 s)" in said


def test_the_watch_rests_between_device_calls() -> None:
    """The host's work (a read, a write, a checkpoint) is not the device's: not watched."""
    clock = Clock()
    watch = DeviceWatch(30, 10, clock)
    with watch.batch():
        clock.now += 1
    clock.now += 1000
    assert watch.hung("cpu:0") is None
    assert (watch.slowest, watch.batches) == (1, 1)
    with pytest.raises(RuntimeError), watch.batch():
        raise RuntimeError("a failed call counts no batch")
    assert watch.batches == 1 and watch.hung("cpu:0") is None


def test_a_busy_beat_hands_a_check_s_reason_on_and_an_idle_one_asks_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat's thread, not the one blocked in the device call, asks the watch."""
    heard: list[str] = []
    done = threading.Event()
    asked: list[bool] = []

    def check() -> str | None:
        asked.append(True)
        return "no batch finished on cpu:0 for 31 s"

    def hook(why: str) -> None:
        heard.append(why)
        done.set()

    monkeypatch.setattr(heartbeat, "checks", [lambda: None, check])
    monkeypatch.setattr(heartbeat, "on_fault", [hook])
    beat = heartbeat.Heartbeat("sqlite://", "cpu0@n", 1.0)
    beat._hand_fault(busy=False)
    assert asked == [] and heard == []
    beat._hand_fault(busy=True)
    assert done.wait(10)
    assert heard == ["no batch finished on cpu:0 for 31 s"]


def test_a_start_check_that_hangs_fails_within_its_bound() -> None:
    release = threading.Event()
    try:
        said = within(0.2, lambda: None if release.wait(60) else "never", "gpu:3")
        assert said == ("worker for gpu:3: its start check did not finish in 0.2 s "
                        "(MXQ_START_CHECK_SECONDS): the device is taken for hung")
    finally:
        release.set()


def test_a_start_check_s_own_verdict_and_error_are_kept() -> None:
    assert within(30, lambda: None, "gpu:0") is None
    assert within(30, lambda: "worker for gpu:0: a matmul gave a wrong result", "gpu:0") == \
        "worker for gpu:0: a matmul gave a wrong result"

    def broken() -> str | None:
        raise OSError("libcuda.so.1: cannot open shared object file")

    assert within(30, broken, "gpu:0") == ("worker for gpu:0: its start check failed (OSError: "
                                           "libcuda.so.1: cannot open shared object file)")
