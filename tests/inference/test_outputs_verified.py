"""A job succeeds only with its own output verified, and leaves nothing it will never use:
a failed Parquet job's parts are removed, a part removed mid-job fails the job naming the gap, a
cancelled job's kept parts are what `mxq results` returns, and a delivery of a job asked for
one device never runs on another."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from mxq.api import routes
from mxq.api.app import app
from mxq.db.outputs import parquet, results
from mxq.db.outputs.results import output_file
from mxq.db.stack import stack_id
from mxq.workers.broker.messages import in_broker
from mxq.workers.broker.publish import publish
from mxq.workers.broker.queues import pool_queue
from mxq.workers.jobs.submit import submit
from tests.conftest import Stack, wait_until
from tests.support.inference import infer_and_wait, save_npy


def _parts(stack: Stack, job_id: int) -> Path:
    final = output_file(stack.home, stack_id(stack.settings.database), job_id, ".parquet")
    return parquet.parts_dir(final)


def test_a_failed_parquet_job_leaves_no_parts(workers: Stack, mlp: dict) -> None:
    x = np.random.default_rng(8).normal(size=(60_000, 64)).astype(np.float32)
    x[50_000, 3] = np.nan  # past two flushes of 20,000: parts are on disk when it fails
    save_npy(workers, "nan-late.npy", x)
    job = infer_and_wait(workers, "mlp64", "nan-late.npy", "--output", "parquet", "--reject-nan",
                 "--batch-size", "500", "--device", "cpu:0")
    assert job["status"] == "failed" and "NaN in sample 50000" in job["error"], job["error"]
    assert not _parts(workers, job["id"]).exists()


def test_a_cancelled_parquet_jobs_kept_parts_are_its_results(workers: Stack, mlp: dict) -> None:
    """What `mxq results` reads of a job that stopped before its merge: its parts, in order."""
    url, home = workers.settings.database, workers.home
    final = output_file(home, stack_id(url), 10**9, ".parquet")
    for first, last in ((0, 100), (100, 250)):
        probs = np.random.default_rng(first).random((last - first, 4)).astype(np.float32)
        parquet.write_part(final, [parquet.from_probabilities(first, probs, 0)], "j1a1")
    record = {"id": 10**9, "params": {"output": "parquet"}, "status": "cancelled", "result": None}
    assert results.count(url, home, record) == 250  # type: ignore[arg-type]
    rows = results.read(url, home, record, limit=3, offset=99)  # type: ignore[arg-type]
    assert [r["index"] for r in rows] == [99, 100, 101]


@pytest.mark.slow
def test_a_part_removed_mid_job_fails_the_job_naming_the_gap(workers: Stack, mlp: dict) -> None:
    x = np.random.default_rng(9).normal(size=(400_000, 64)).astype(np.float32)
    save_npy(workers, "part-gone.npy", x)
    job_id = submit(workers.settings, "infer", {"model": "mlp64", "input": "part-gone.npy",
                                                "output": "parquet", "batch_size": 256}, "cpu:1")
    folder = _parts(workers, job_id)
    first = wait_until(lambda: sorted(folder.glob("000000000000-*.parquet")), 300,
                       "the job's first part", until=bool, interval=0.01)
    first[0].unlink()
    done = workers.wait(job_id, timeout=300)
    assert done["status"] == "failed", done
    error = done["error"] or ""
    assert "output incomplete" in error and "lack samples [0, " in error
    assert not folder.exists()


def test_a_stray_pool_delivery_runs_only_on_the_device_asked(workers: Stack) -> None:
    """A duplicate message of a `--device cpu:0` job on the pool reached the idle cpu:1 and ran
    it there; it goes back to cpu:0's queue instead."""
    s = workers.settings
    busy = submit(s, "probe", {"size": 512, "batch": 8, "repeat": 400}, "cpu:0")
    wait_until(lambda: workers.job(busy)["status"], 120, "cpu:0 busy", until=lambda v: v == "running",
               interval=0.05)
    job_id = submit(s, "probe", {"size": 32, "batch": 1, "repeat": 1}, "cpu:0")
    pool = pool_queue("cpu")
    publish(s, job_id, "probe", pool)  # the stray copy: cpu:1 is idle
    wait_until(lambda: in_broker(s.broker, {pool}), 120, "cpu:1 to hand the stray copy on",
               until=lambda seen: job_id not in seen[0] and job_id not in seen[1], interval=0.05)
    if workers.job(busy)["status"] == "running":  # cpu:0 still busy: cpu:1 sent the copy back
        assert workers.job(job_id)["status"] == "queued"
    done = workers.wait(job_id, timeout=300)
    assert done["status"] == "succeeded" and done["device"] == "cpu:0", json.dumps(done)


# An output file cut short on disk (issue 44, item 10): `mxq results` says what is wrong with
# it in one line, the API in a problem document (it was a traceback and a plain-text 500); and
# any bug of the API is still a problem document, with no traceback.
@pytest.mark.parametrize("output", ["parquet", "npy"])
def test_a_truncated_output_is_named_not_a_traceback(workers: Stack, mlp: dict, output: str) -> None:
    np.save(workers.home / "data" / f"damaged-{output}.npy", np.ones((300, 64), np.float32))
    job = workers.mxq_json("infer", "mlp64", f"damaged-{output}.npy", "--output", output, "--wait")
    assert job["status"] == "succeeded", job["error"]
    with open(job["output"], "r+b") as f:  # cut short, as a full disk or a bad copy leaves it
        f.truncate(100)
    shown = workers.mxq("results", str(job["id"]))
    assert shown.returncode == 2 and "Traceback" not in shown.stderr, shown.stderr
    assert f"job {job['id']}'s output cannot be read" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1, shown.stderr
    app.dependency_overrides[routes.settings] = lambda: workers.settings
    try:
        client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        answer = client.get(f"/api/v1/jobs/{job['id']}/predictions")
    finally:
        app.dependency_overrides.clear()
    assert answer.status_code == 503 and answer.headers["content-type"] == "application/problem+json"
    assert f"job {job['id']}'s output cannot be read" in answer.json()["detail"]


def test_a_bug_is_still_a_problem_document(workers: Stack) -> None:
    def broken() -> None:
        raise RuntimeError("secret internals /etc/shadow")

    app.dependency_overrides[routes.settings] = broken
    try:
        client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000),
                            raise_server_exceptions=False)
        answer = client.get("/api/v1/models")
    finally:
        app.dependency_overrides.clear()
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["detail"] == "internal error (RuntimeError); the API's log has the details"
    assert "shadow" not in answer.text
