"""SIGKILL device workers at random points of real inference and training jobs: every job ends
succeeded, every prediction row exists exactly once, and training resumes from checkpoints."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from mxq.db import events
from mxq.db.epochs import list_epochs
from mxq.workers.submit import submit
from tests.faults.stacks import FaultStack, report

# Claims and prediction writes under SIGKILL differ by backend: both legs.
pytestmark = [pytest.mark.slow, pytest.mark.both_legs]

KILLS = 10
INFER_SAMPLES = 400_000
TRAIN_EPOCHS = 30


def _running_unkilled(stack: FaultStack, ids: list[int], killed: dict[int, int],
                      max_kills: int) -> dict | None:
    """A job running in an attempt not yet killed, on a live worker."""
    for job_id, status in stack.statuses(ids).items():
        if status == "running" and killed.get(job_id, 0) < max_kills:
            job = stack.job(job_id)
            if job["attempts"] > killed.get(job_id, 0) and job["worker"] and \
                    stack.worker_pid(job["worker"]):
                return job
    return None


def _kill_when(stack: FaultStack, ids: list[int], killed: dict[int, int], max_kills: int,
               ready, top_up=None) -> dict:  # noqa: ANN001
    """Wait for a running job that `ready` accepts, then SIGKILL its worker.

    `top_up` adds a job to `ids` when none is left that could still be killed."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = stack.statuses(ids)
        if top_up and not [i for i, v in states.items()
                           if v in ("queued", "running") and killed.get(i, 0) < max_kills]:
            ids.append(top_up())
        job = _running_unkilled(stack, ids, killed, max_kills)
        if job is not None and ready(job):
            if stack.kill_worker(job["worker"]):
                killed[job["id"]] = killed.get(job["id"], 0) + 1
                return job
        time.sleep(0.05)
    raise AssertionError(f"no job to kill in 300s: {stack.statuses(ids)}")


@pytest.mark.timeout(1200)
def test_sigkill_mid_inference(faulty: FaultStack) -> None:
    rng = random.Random(7)
    faulty.model()
    faulty.samples("kill.npy", INFER_SAMPLES)

    def top_up() -> int:
        return faulty.infer("mlp64", "kill.npy")

    ids = [top_up() for _ in range(3)]
    killed: dict[int, int] = {}
    points = []
    for _ in range(KILLS):
        target = rng.uniform(0.0, 0.8)
        job = _kill_when(faulty, ids, killed, 1, lambda j, t=target: j["progress"] >= t, top_up)
        points.append(round(job["progress"], 2))
    done = faulty.wait_all(ids, timeout=900)

    reference = None
    missing = duplicated = 0
    for job_id, job in done.items():
        assert job["status"] == "succeeded", (job_id, job["error"])
        index, classes = faulty.predicted(job_id)
        missing += INFER_SAMPLES - len(np.unique(index))
        duplicated += len(index) - len(np.unique(index))
        assert np.array_equal(index, np.arange(INFER_SAMPLES))
        reference = classes if reference is None else reference
        assert np.array_equal(classes, reference), f"job {job_id} predicted other classes"
    assert sum(killed.values()) == KILLS
    for job_id in killed:
        assert done[job_id]["attempts"] == 2  # killed once, then run to the end
        kinds = [e["kind"] for e in events.list_events(faulty.settings.database, job_id)]
        assert events.REQUEUED in kinds
    report("SIGKILL mid-inference", {"backend": faulty.name, "trials": KILLS, "jobs": len(ids),
                                     "finished": len(done), "rows_lost": missing,
                                     "rows_duplicated": duplicated, "kill_progress": points})


@pytest.mark.timeout(1200)
def test_sigkill_mid_training(faulty: FaultStack) -> None:
    rng = random.Random(11)
    s = faulty.settings
    plan = [3, 3, 2, 2]  # kills per job: under the 5-attempt cap, 10 in all
    killed: dict[int, int] = {}
    at_epochs, ids = [], []
    for i, kills in enumerate(plan):  # one job at a time, so none ends before its kills
        job_id = submit(s, "train", {"arch": "mlp", "dataset": "digits", "name": f"killed{i}",
                                     "devices": 1 + i % 2, "epochs": TRAIN_EPOCHS,
                                     "val_fraction": 0.1, "seed": i}, "auto", allow_offline=True)
        ids.append(job_id)
        for target in sorted(rng.sample(range(2, TRAIN_EPOCHS - 5), kills)):
            def ready(job: dict, t: int = target, j: int = job_id) -> bool:
                return job["id"] == j and len(list_epochs(s.database, j)) >= t

            _kill_when(faulty, [job_id], killed, kills, ready)
            at_epochs.append(target)
    done = faulty.wait_all(ids, timeout=900)
    for job_id, kills in zip(ids, plan, strict=True):
        job = done[job_id]
        assert job["status"] == "succeeded", (job_id, job["error"])
        assert job["attempts"] == kills + 1
        assert job["result"]["resumed_from_epoch"] >= 1
        detail = faulty.mxq_json("job", str(job_id))
        assert [e["epoch"] for e in detail["epochs"]] == list(range(1, TRAIN_EPOCHS + 1))
        assert detail["epochs"][-1]["val_accuracy"] >= 0.85
    free = [d for d in faulty.mxq_json("devices") if d["alive"]]
    assert len(free) == 2 and all(d["leased_by"] is None for d in free)
    report("SIGKILL mid-training", {"backend": faulty.name, "trials": KILLS, "jobs": len(ids),
                                    "finished": len(done), "rows_lost": 0, "rows_duplicated": 0,
                                    "kill_epochs": at_epochs})
