"""A job that makes no progress, its worker beating all along (a read blocked for good once held a
worker for ever): the reconciler fails it past MXQ_STALL_SECONDS, or cancels it past
MXQ_CANCEL_GRACE_SECONDS after a cancel it did not heed; the worker, still inside it, exits and the
launcher starts a fresh one, which runs the device's next job.

The job that makes no progress is a real one: a probe whose single matrix multiply (8192 x 8192,
about 1.1 TFLOP on the one core a CPU device is pinned to) reports nothing for tens of seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mxq.db import events
from mxq.workers.fleet.device_table import device_table
from mxq.workers.jobs.submit import submit
from tests.conftest import NODE, Stack, _stack, launch, stop, wait_until

pytestmark = pytest.mark.slow

SLOW_PROBE = {"size": 8192, "batch": 1, "repeat": 1}
CASES = {  # (settings, what the job's error says)
    "no progress": ({"MXQ_STALL_SECONDS": "4", "MXQ_CANCEL_GRACE_SECONDS": "4"},
                    "made no progress for 4 s (MXQ_STALL_SECONDS) although its worker was alive"),
    "a cancel not heeded": ({"MXQ_STALL_SECONDS": "600", "MXQ_CANCEL_GRACE_SECONDS": "3"},
                            "did not stop within 3 s of its cancel (MXQ_CANCEL_GRACE_SECONDS)"),
}


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Stack]:
    yield from _stack("embedded", tmp_path, 9)


def _worker_pid(stack: Stack) -> int | None:
    return next((pid for d in device_table(stack.settings)
                 if d["device"] == "cpu:0" and d["node"] == NODE and d["alive"]
                 and isinstance(pid := d["pid"], int)), None)


@pytest.mark.parametrize("case", list(CASES))
def test_a_job_without_progress_is_ended_and_its_worker_replaced(embedded: Stack, case: str) -> None:
    env, needle = CASES[case]
    stack = embedded
    stack.env.update({**env, "MXQ_RECONCILE_SECONDS": "1"})
    launcher = launch(stack, "--with-schedule")
    try:
        first = _worker_pid(stack)
        job_id = submit(stack.settings, "probe", SLOW_PROBE, "cpu:0")
        wait_until(lambda: stack.job(job_id)["status"], 120, f"job {job_id} to start",
                   until=lambda status: status == "running", interval=0.2)
        if case == "a cancel not heeded":
            assert stack.mxq_json("cancel", str(job_id))["outcome"] == "requested"
        ended = stack.wait(job_id, timeout=120)
        assert ended["status"] == ("failed" if case == "no progress" else "cancelled"), ended
        assert needle in (ended["error"] or ""), ended["error"]
        assert events.STALLED in [e["kind"] for e in events.list_events(stack.settings.database, job_id)]
        fresh = wait_until(lambda: _worker_pid(stack), 120, "a fresh worker on cpu:0",
                           until=lambda pid: pid is not None and pid != first, interval=0.5)
        assert fresh != first
        after = submit(stack.settings, "probe", {"size": 32, "batch": 1, "repeat": 1}, "cpu:0")
        assert stack.wait(after, timeout=120)["status"] == "succeeded"  # the device is free again
    finally:
        stop(launcher)
