"""Dynamic batching through real workers: queued single-sample jobs of one model run as one batch,
each job keeps its own rows, outcome and throughput point, and a bad one fails alone."""

from __future__ import annotations

import numpy as np
import pytest

from mxq.db import jobs
from mxq.db.outputs import predictions
from mxq.db.reports.history import metrics
from mxq.tasks.inference import batching
from mxq.workers.jobs.submit import submit, submit_many
from tests.conftest import Stack
from tests.support.inference import predict_directly, save_npy

JOBS = 120


@pytest.mark.both_legs  # queued jobs claimed together in SQL (claim_many)
def test_single_sample_jobs_are_merged_and_split_back(workers: Stack, mlp: dict) -> None:
    s = workers.settings
    x = np.random.default_rng(5).normal(size=(JOBS, 64)).astype(np.float32)
    (workers.home / "data" / "one").mkdir(exist_ok=True)
    for i in range(JOBS):
        save_npy(workers, f"one/{i}.npy", x[i:i + 1])
    save_npy(workers, "one/wide.npy", np.zeros((1, 32), np.float32))
    params = [{"model": "mlp64", "input": f"one/{i}.npy"} for i in range(JOBS)]
    params.insert(JOBS // 2, {"model": "mlp64", "input": "one/wide.npy"})
    # cpu:0 is held busy until every message is queued, so one batch takes them all at once.
    hold = submit(s, "probe", {"size": 512, "batch": 8, "repeat": 10_000}, "cpu:0")
    workers.wait(hold, until=("running",))
    ids = submit_many(s, "infer", params, "cpu:0")  # one device queue: they wait for each other
    jobs.cancel(s.database, hold)
    done = {i: workers.wait(i) for i in ids}

    bad = ids[JOBS // 2]
    assert done[bad]["status"] == "failed" and "64" in (done[bad]["error"] or ""), done[bad]["error"]
    good = [i for i in ids if i != bad]
    assert all(done[i]["status"] == "succeeded" for i in good), [done[i]["error"] for i in good]
    merged = [done[i] for i in good if (done[i]["result"] or {})["batched_jobs"] > 1]
    assert merged, "no job was merged with another"
    assert max((j["result"] or {})["batched_jobs"] for j in merged) >= 10
    assert all(done[i]["attempts"] == 1 and done[i]["samples"] == 1 for i in good)
    # The taken jobs' messages were dropped from the queue: hardly any reached the worker.
    logs = "".join(p.read_text() for p in (workers.home / "logs").glob("*.log"))
    refused = sum(f"job {j['id']} not run here" in logs for j in merged)
    assert refused <= len(merged) // 10, (refused, len(merged))

    expected = predict_directly(workers, "mlp64", x)
    for n, job_id in enumerate(good):
        [row] = predictions.read(s.database, job_id)
        assert row["index"] == 0
        assert row["predicted_class"] == int(expected[n].argmax())
        assert abs(row["score"] - float(expected[n].max())) < 1e-5
        [point] = metrics(s.database, job_id)
        assert point["samples"] == 1 and point["device"] == "cpu:0"


def test_a_larger_job_is_never_merged(workers: Stack, mlp: dict) -> None:
    save_npy(workers, "hundred.npy", np.ones((100, 64), np.float32))
    job = workers.wait(submit(workers.settings, "infer", {"model": "mlp64", "input": "hundred.npy"},
                              "cpu:1"))
    assert job["status"] == "succeeded" and "batched_jobs" not in (job["result"] or {})
    assert predictions.count(workers.settings.database, job["id"]) == 100


def test_devices_walk_the_candidates_from_different_points() -> None:
    """Every candidate once, in slices; two devices start apart, so they rarely open the same
    inputs at once."""
    found = list(range(300))
    walks = {i: batching._slices(found, i) for i in range(4)}
    for parts in walks.values():
        assert sorted(x for part in parts for x in part) == found
        assert all(0 < len(part) <= batching.CLAIM_SLICE for part in parts)
    starts = [parts[0][0] for parts in walks.values()]
    assert len(set(starts)) == 4 and abs(starts[0] - starts[1]) >= len(found) // 3
    assert batching._slices([], 1) == []
