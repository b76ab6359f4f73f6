"""Preemptions in flight while workers are SIGKILLed and the broker restarts: low jobs yield to
high ones and resume, some are killed mid-way, and every job still ends succeeded with each of
its predictions stored exactly once, the same as every other job's over the same input."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from mxq.json_types import JsonObject
from mxq.priorities import Priority
from mxq.workers.jobs.submit import submit
from tests.conftest import wait_until
from tests.faults.stacks import FaultStack, report
from tests.support.inference import committed_position

pytestmark = [pytest.mark.slow, pytest.mark.both_legs]

# A low job lasts seconds (about 6 s here) on one CPU device: since reads hold many batches, 20,000
# samples took 1.0-1.5 s, ended before the first high job's ask was heard, and none yielded.
SAMPLES = 100_000
LOWS, HIGHS, KILLS = 6, 8, 3
LOW_BATCH, HIGH_BATCH = 8, 128  # at 128 a low job ended within a second on a fast CPU: no preemption


def _submit(stack: FaultStack, name: str, level: str) -> int:
    batch = LOW_BATCH if level == "low" else HIGH_BATCH
    params: JsonObject = {"model": "lenet-faults", "input": name, "batch_size": batch, "engine": "onnx"}
    return submit(stack.settings, "infer", params, "auto", allow_offline=True,
                  priority=Priority.of(level))


def _kill_one_running(stack: FaultStack, ids: list[int], rng: random.Random) -> bool:
    running = [i for i, v in stack.statuses(ids).items() if v == "running"]
    if not running:
        return False
    worker = stack.job(rng.choice(running))["worker"]
    return worker is not None and stack.kill_worker(worker)


@pytest.mark.timeout(900)
def test_preemptions_with_kills_and_a_broker_restart_lose_and_duplicate_nothing(
        faulty: FaultStack) -> None:
    rng = random.Random(11)
    proc = faulty.mxq("models", "add", "lenet-faults", "--arch", "lenet", "--input-shape", "1,28,28",
                      "--classes", "10")
    assert proc.returncode == 0, proc.stderr
    x = np.random.default_rng(4).standard_normal((SAMPLES, 1, 28, 28), dtype=np.float32)
    np.save(faulty.home / "data" / "preempt-faults.npy", x)
    np.save(faulty.home / "data" / "urgent-faults.npy", x[:256])
    lows = [_submit(faulty, "preempt-faults.npy", "low") for _ in range(LOWS)]
    wait_until(lambda: sum(committed_position(faulty, i) > 0 for i in lows), 120,
               "both devices to run a low job", until=lambda n: n >= 2, interval=0.05)
    highs = [_submit(faulty, "urgent-faults.npy", "high")]  # both busy: one low job yields
    kills = 0
    for i in range(1, HIGHS):
        time.sleep(rng.uniform(0.5, 2.0))
        highs.append(_submit(faulty, "urgent-faults.npy", "high"))
        if i in (2, 4, 6) and kills < KILLS:
            kills += _kill_one_running(faulty, lows, rng)
        if i == 3:
            faulty.restart_broker(down_seconds=2.0)
    done = faulty.wait_all(lows + highs, timeout=800)

    assert all(job["status"] == "succeeded" for job in done.values()), {
        i: j["error"] for i, j in done.items() if j["status"] != "succeeded"}
    preempted = sum(done[i]["preemptions"] for i in lows)
    assert preempted > 0, {i: (done[i]["started_at"], done[i]["finished_at"]) for i in lows}  # they ran
    reference = None
    missing = duplicated = 0
    for job_id in lows:
        index, classes = faulty.predicted(job_id)
        missing += SAMPLES - len(np.unique(index))
        duplicated += len(index) - len(np.unique(index))
        assert np.array_equal(index, np.arange(SAMPLES)), job_id
        reference = classes if reference is None else reference
        assert np.array_equal(classes, reference), f"job {job_id} predicted other classes"
    assert missing == duplicated == 0
    report("preemptions with SIGKILLs and a broker restart",
           {"backend": faulty.name, "trials": 1, "jobs": len(done), "finished": len(done),
            "preemptions": preempted, "kills": kills, "rows_lost": missing,
            "rows_duplicated": duplicated})
