"""Priorities and preemption through real workers: a waiting `high` job is taken before the `low`
jobs queued ahead of it, and a `low` job running on the device it needs yields at a checkpoint,
lets it run, and resumes where it stopped: its predictions those of an uninterrupted run, each
sample stored once; a training resumes from the epoch it yielded at."""

from __future__ import annotations

import numpy as np
import pytest

from mxq.db import events
from mxq.db.outputs import predictions
from mxq.db.records import EventRecord, JobRecord
from mxq.json_types import JsonObject
from mxq.priorities import Priority
from mxq.workers.jobs.submit import submit
from tests.conftest import Stack, wait_until
from tests.support.inference import committed_position, save_npy

LOW, HIGH = Priority.of("low"), Priority.of("high")
BLOCKER = Priority.of("low", preemptible=False)
EPOCHS = 30
# A job that must still run while the test looks: the low one that yields (about 9 s at one sample a
# batch here) and the blocker (several seconds at 256). Since reads hold many batches, 30,000 samples
# took 2.2 s, and one CI run saw the low job asked to yield 0.08 s before its end.
LONG_SAMPLES = 120_000


def _infer(stack: Stack, name: str, priority: Priority, device: str = "cpu:0",
           model: str = "mlp64", batch_size: int = 256) -> int:
    return submit(stack.settings, "infer", {"model": model, "input": name, "batch_size": batch_size},
                  device, priority=priority)


def _started(stack: Stack, job_id: int) -> str:
    started = stack.wait(job_id)["started_at"]
    assert started is not None
    return started


@pytest.fixture(scope="module")
def lenet(workers: Stack) -> str:
    """A LeNet for 28x28 images: slow enough on a CPU (about 13,000 samples a second at
    one a batch) that a job of LONG_SAMPLES lasts seconds, long enough to be preempted in the
    middle."""
    proc = workers.mxq("models", "add", "lenet28", "--arch", "lenet", "--input-shape", "1,28,28",
                       "--classes", "10")
    assert proc.returncode == 0, proc.stderr
    return "lenet28"


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_a_high_job_is_taken_before_the_low_jobs_queued_ahead_of_it(workers: Stack, mlp: dict,
                                                                   lenet: str) -> None:
    rng = np.random.default_rng(3)
    save_npy(workers, "prio-long.npy", rng.standard_normal((LONG_SAMPLES, 1, 28, 28), dtype=np.float32))
    save_npy(workers, "prio-small.npy", rng.standard_normal((2_000, 64)).astype(np.float32))
    blocker = _infer(workers, "prio-long.npy", BLOCKER, model=lenet)  # holds cpu:0 for seconds
    wait_until(lambda: workers.job(blocker)["status"], 60, "the blocker to run",
               until=lambda s: s == "running")
    lows = [_infer(workers, "prio-small.npy", LOW) for _ in range(3)]
    high = _infer(workers, "prio-small.npy", HIGH)
    view = [e for e in workers.mxq_json("queue", "--limit", "1000") if e["id"] in (high, *lows)]
    assert [e["id"] for e in view] == [high, *lows]  # what runs next first
    assert view[0]["why"] == ("next, priority high: its 1 device is busy; none of their jobs may "
                              "yield to it")  # the blocker is not preemptible
    assert view[1]["why"] == "behind 1 job that runs first on the devices it could use"
    shown = workers.mxq("job", str(lows[-1]))
    assert shown.returncode == 0
    assert "behind 3 jobs that run first on the devices it could use" in shown.stdout
    assert workers.wait(blocker)["status"] == "succeeded"
    for job_id in (high, *lows):
        assert workers.wait(job_id)["status"] == "succeeded"
    assert _started(workers, high) < min(_started(workers, i) for i in lows)
    assert workers.job(high)["priority"] == "high" and workers.job(lows[0])["preemptible"] is True
    assert events.list_events(workers.settings.database, blocker) == []  # not preemptible


def _stored(stack: Stack, job_id: int) -> list[tuple[int, int, float]]:
    return [(r["index"], r["predicted_class"], r["score"])
            for r in predictions.read(stack.settings.database, job_id)]


def _preempted(stack: Stack, job_id: int) -> list[EventRecord]:
    return [e for e in events.list_events(stack.settings.database, job_id)
            if e["kind"] == events.PREEMPTED]


@pytest.mark.slow  # about 30 s of real preemption: make test-all (CI)
def test_a_low_inference_yields_to_a_high_one_and_resumes_with_every_sample_once(
        workers: Stack, lenet: str) -> None:
    x = np.random.default_rng(5).standard_normal((LONG_SAMPLES, 1, 28, 28), dtype=np.float32)
    save_npy(workers, "preempt.npy", x)
    save_npy(workers, "urgent.npy", x[:500])
    # One sample a batch: the low job lasts seconds (several one-second flushes) even on a fast
    # CPU, where a batch of 256 ends 30,000 samples in about one, before the high one arrives.
    low = _infer(workers, "preempt.npy", LOW, model=lenet, batch_size=1)
    wait_until(lambda: committed_position(workers, low), 60, "the low job to store a flush",
               until=lambda n: n > 0, interval=0.05)
    high = _infer(workers, "urgent.npy", HIGH, model=lenet)

    done: JobRecord = workers.wait(low, timeout=180)
    urgent = workers.wait(high)

    assert (done["status"], urgent["status"]) == ("succeeded", "succeeded")
    [yielded] = _preempted(workers, low)
    assert (yielded["data"] or {}).get("to") == high and done["preemptions"] == 1
    listed = [j for j in workers.mxq_json("jobs", "--limit", "1000") if j["id"] == low]
    assert (done["attempts"], [j["attempts"] for j in listed]) == (1, [1])  # a yield is no attempt
    assert urgent["finished_at"] is not None and done["finished_at"] is not None
    assert urgent["finished_at"] < done["finished_at"]
    kinds = [e["kind"] for e in events.list_events(workers.settings.database, low)]
    assert events.RESUMED in kinds and (done["result"] or {}).get("resumed_from", 0) > 0
    uninterrupted = workers.wait(_infer(workers, "preempt.npy", Priority.of("normal"), model=lenet,
                                        batch_size=1), timeout=180)
    stored, reference = _stored(workers, low), _stored(workers, uninterrupted["id"])
    assert [i for i, _, _ in stored] == list(range(len(x)))  # each sample once, none lost
    assert [c for _, c, _ in stored] == [c for _, c, _ in reference]
    assert np.allclose([p for _, _, p in stored], [p for _, _, p in reference], rtol=1e-6)


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_a_low_training_yields_at_an_epoch_and_resumes_from_its_checkpoint(workers: Stack) -> None:
    s = workers.settings
    params: JsonObject = {"arch": "mlp", "dataset": "digits", "name": "preempted-mlp", "epochs": EPOCHS,
              "batch_size": 8, "device_list": ["cpu:1"]}
    train = submit(s, "train", params, "cpu:1", priority=LOW)
    wait_until(lambda: (workers.job(train).get("progress") or 0), 120, "the first epoch",
               until=lambda p: p >= 1 / EPOCHS, interval=0.1)
    high = submit(s, "probe", {"size": 64, "batch": 1, "repeat": 1}, "cpu:1", priority=HIGH)

    done = workers.wait(train, timeout=300)
    assert done["status"] == "succeeded" and workers.wait(high)["status"] == "succeeded"
    [yielded] = _preempted(workers, train)
    assert (yielded["data"] or {}).get("to") == high
    record = workers.mxq_json("job", str(train))
    resumed_from = record["result"]["resumed_from_epoch"]
    assert 1 <= resumed_from < EPOCHS
    assert [e["epoch"] for e in record["epochs"]] == list(range(1, EPOCHS + 1))  # none redone, none lost
