"""The retention policy (issue 44, item 11): nothing was ever deleted. `mxq gc` (and the schedule
process every hour) removes a finished training's checkpoints once its version is registered,
finished jobs' run files and stale staging files; with MXQ_KEEP_OUTPUT_DAYS the outputs of old
inference jobs, never a pinned one's; with MXQ_KEEP_VERSIONS old unpromoted versions, never a
promoted one or one a queued job names. `--dry-run` removes nothing and says the same."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import update

from mxq.api import routes
from mxq.api.app import app
from mxq.db.engine import session_scope
from mxq.db.outputs import predictions
from mxq.db.outputs.results import output_file
from mxq.db.schema import Job, utcnow
from mxq.db.stack import stack_id
from mxq.status import JobStatus
from mxq.workers.storage.versions import store_dir
from tests.conftest import Stack

TOKEN = "retention-admin-token"


def _gc(stack: Stack, *args: str, **env: str) -> dict[str, Any]:
    proc = stack.mxq("gc", *args, "--json", env=env or None)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _backdate(stack: Stack, job_id: int, days: int) -> None:
    with session_scope(stack.settings.database) as s:
        s.execute(update(Job).where(Job.id == job_id).values(finished_at=utcnow() - timedelta(days=days)))


def _where(removed: dict[str, Any]) -> set[str]:
    return {r["where"] for r in removed["removed"]}


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_gc_removes_what_nothing_reads_again_and_old_outputs_but_a_pinned_one(
        workers: Stack, mlp: dict) -> None:
    home, url = workers.home, workers.settings.database
    trained = workers.mxq_json("train", "mlp", "digits", "--name", "gc-trained", "--epochs", "1", "--wait")
    assert trained["status"] == "succeeded", trained["error"]
    checkpoints = home / "checkpoints" / stack_id(url) / f"job-{trained['id']}"
    assert checkpoints.is_dir()
    np.save(home / "data" / "gc.npy", np.random.default_rng(0).random((300, 64), dtype=np.float32))
    old, kept = (workers.mxq_json("infer", "mlp64", "gc.npy", "--output", out, "--wait")
                 for out in ("npy", "db"))
    assert old["status"] == kept["status"] == "succeeded"
    old_file = Path(old["result"]["output"])
    assert old_file.is_file() and old_file.with_suffix(".lock").is_file()  # its writer's lock
    assert workers.mxq("pin", str(kept["id"])).returncode == 0
    for job in (old, kept):
        _backdate(workers, job["id"], days=10)
    (home / "tmp").mkdir(exist_ok=True)
    stale, fresh = home / "tmp" / "gc-stale.part", home / "tmp" / "gc-fresh.part"
    for f in (stale, fresh):
        f.write_bytes(b"x" * 100)
    os.utime(stale, (time.time() - 3 * 86400,) * 2)

    said = _gc(workers, "--dry-run", MXQ_KEEP_OUTPUT_DAYS="5")
    assert {str(checkpoints), str(old_file), str(stale)} <= _where(said), said
    assert str(fresh) not in _where(said) and f"job {kept['id']}" not in _where(said)
    assert checkpoints.is_dir() and old_file.is_file() and stale.is_file()  # a dry run

    done = _gc(workers, MXQ_KEEP_OUTPUT_DAYS="5")
    assert {str(checkpoints), str(old_file), str(stale)} <= _where(done)
    assert done["bytes"] >= 100 and not done["dry_run"]
    assert not checkpoints.exists() and not old_file.exists() and not stale.exists()
    assert not old_file.with_suffix(".lock").exists()  # issue 58: it was left behind
    line = workers.mxq_json("lineage", str(old["id"]))  # issue 58: lineage says the output went
    assert line["output"] == str(old_file) and line["output_removed_at"] == record_removed(workers, old)
    shown = workers.mxq("lineage", str(old["id"])).stdout
    assert "(removed by mxq gc at" in shown
    assert fresh.is_file()
    record = workers.mxq_json("job", str(old["id"]))
    assert record["output_removed_at"] is not None and record["status"] == "succeeded"
    gone = workers.mxq("results", str(old["id"]))
    assert gone.returncode != 0 and "removed by the retention policy" in gone.stderr, gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1
    assert workers.mxq_json("job", str(kept["id"]))["pinned"] is True
    rows = workers.mxq("results", str(kept["id"]), "--format", "json")
    assert rows.returncode == 0 and len(json.loads(rows.stdout)) == 300  # pinned: kept
    again = _gc(workers, MXQ_KEEP_OUTPUT_DAYS="5")["removed"]
    assert not [r for r in again if r["what"] == "output"], again  # once gone, gone


def record_removed(stack: Stack, job: dict[str, Any]) -> str:
    removed = stack.mxq_json("job", str(job["id"]))["output_removed_at"]
    assert removed is not None
    return str(removed)


def test_a_job_is_pinned_and_unpinned_by_its_owner_through_the_api(workers: Stack) -> None:
    s = workers.settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: s
    try:
        client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        auth = {"Authorization": f"Bearer {TOKEN}"}
        job = workers.mxq_json("probe", "--size", "16", "--wait")
        pinned = client.put(f"/api/v1/jobs/{job['id']}/pin", headers=auth)
        assert pinned.status_code == 200 and pinned.json()["pinned"] is True, pinned.text
        assert client.delete(f"/api/v1/jobs/{job['id']}/pin", headers=auth).json()["pinned"] is False
        assert client.put("/api/v1/jobs/999999999/pin", headers=auth).status_code == 404
        assert client.put(f"/api/v1/jobs/{job['id']}/pin").status_code == 401
    finally:
        app.dependency_overrides.clear()


@pytest.mark.both_legs
def test_old_unpromoted_versions_go_but_a_promoted_one_and_those_jobs_or_schedules_name(
        isolated: Stack) -> None:
    """Of 7 versions, with MXQ_KEEP_VERSIONS=1: 7 (the newest), 2 (promoted), 3 (a queued
    inference names it), 1 (a queued `mxq train --from gcv:1` does: issue 58, it was removed)
    and 5 (a schedule pins it) stay; 4 and 6 go."""
    from mxq.workers.jobs.submit import submit_request
    from mxq.workers.schedules.scoring import add_infer_schedule

    stack, url = isolated, isolated.settings.database
    for _ in range(7):
        assert stack.mxq("models", "add", "gcv", "--arch", "mlp", "--input-shape", "64").returncode == 0
    assert stack.mxq("models", "promote", "gcv", "2").returncode == 0
    folders = {v: store_dir(stack.home, url, "gcv", v) for v in range(1, 8)}
    assert all(f.is_dir() for f in folders.values())
    np.save(stack.home / "data" / "gcv.npy", np.zeros((4, 64), np.float32))
    queued = stack.mxq("infer", "gcv:3", "gcv.npy", "--allow-offline", "--json")
    assert queued.returncode == 0, queued.stderr  # no worker: it stays queued, naming version 3
    submit_request(stack.settings, "train", {"from_model": "gcv", "from_version": 1,
                                             "dataset": "digits", "name": "gcv-tuned"},
                   allow_offline=True)  # queued too, naming version 1
    add_infer_schedule(stack.settings, "gcv-pinned", "0 3 * * *", "UTC", "gcv.npy",
                       {"model": "gcv:5"}, rescore=None)

    said = _gc(stack, "--dry-run", MXQ_KEEP_VERSIONS="1")
    assert [r["where"] for r in said["removed"] if r["what"] == "version"] == ["gcv:6", "gcv:4"]
    done = _gc(stack, MXQ_KEEP_VERSIONS="1")
    assert [r["where"] for r in done["removed"] if r["what"] == "version"] == ["gcv:6", "gcv:4"]
    assert not folders[4].exists() and not folders[6].exists()
    assert all(folders[v].is_dir() for v in (1, 2, 3, 5, 7))
    versions = {m["version"]: m for m in stack.mxq_json("models", "gcv")}
    assert versions[4]["removed_at"] is not None and versions[3]["removed_at"] is None
    refused = stack.mxq("infer", "gcv:4", "gcv.npy", "--allow-offline")
    assert refused.returncode != 0 and "gcv' version 4 was removed by the retention policy" in refused.stderr
    assert "versions kept: 1, 2, 3, 5, 7" in refused.stderr
    assert _gc(stack, MXQ_KEEP_VERSIONS="1")["removed"] == []  # nothing else may go


def _rows(url: str, job_id: int, n: int) -> None:
    predictions.write(url, [(job_id, i, i % 10, 0.5, None) for i in range(n)])


def _set(stack: Stack, job_id: int, **values: Any) -> None:
    with session_scope(stack.settings.database) as s:
        s.execute(update(Job).where(Job.id == job_id).values(**values))


@pytest.mark.both_legs
def test_an_expired_jobs_prediction_rows_go_and_a_pinned_ones_stay(isolated: Stack) -> None:
    """An unpinned inference job finished before MXQ_KEEP_OUTPUT_DAYS whose output is SQL rows
    (`--output db`): `mxq gc` deletes its rows and marks its record; a pinned one keeps them."""
    stack, url = isolated, isolated.settings.database
    assert stack.mxq("models", "add", "gcrows", "--arch", "mlp", "--input-shape", "8").returncode == 0
    np.save(stack.home / "data" / "gcrows.npy", np.zeros((40, 8), np.float32))
    old, kept = (stack.mxq_json("infer", "gcrows", "gcrows.npy", "--output", "db", "--allow-offline")
                 for _ in range(2))
    for job in (old, kept):  # as a worker leaves a job that wrote its 40 rows, 10 days ago
        _rows(url, job["id"], 40)
        _set(stack, job["id"], status=JobStatus.SUCCEEDED, result={"output": "db"},
             started_at=utcnow() - timedelta(days=10), finished_at=utcnow() - timedelta(days=10))
    assert stack.mxq("pin", str(kept["id"])).returncode == 0

    said = _gc(stack, "--dry-run", MXQ_KEEP_OUTPUT_DAYS="5")
    rows_said = [r for r in said["removed"] if r["what"] == "prediction rows"]
    assert [r["where"] for r in rows_said] == [f"job {old['id']}"], said
    assert rows_said[0]["why"].startswith("40 rows, finished more than 5 days ago")
    assert predictions.count(url, old["id"]) == 40  # a dry run

    done = _gc(stack, MXQ_KEEP_OUTPUT_DAYS="5")
    assert [r["where"] for r in done["removed"] if r["what"] == "prediction rows"] == [f"job {old['id']}"]
    assert predictions.count(url, old["id"]) == 0
    assert stack.mxq_json("job", str(old["id"]))["output_removed_at"] is not None
    assert predictions.count(url, kept["id"]) == 40  # pinned: kept
    assert stack.mxq_json("job", str(kept["id"]))["output_removed_at"] is None
    assert _gc(stack, MXQ_KEEP_OUTPUT_DAYS="5")["removed"] == []  # once gone, gone


@pytest.mark.both_legs
def test_a_running_or_queued_jobs_files_stay_however_old(isolated: Stack) -> None:
    """Never a running job's files: an inference job running for 10 days keeps its committed
    rows and output parts, a training requeued 10 days ago (preempted) its checkpoints and its
    first attempt's run file, whatever MXQ_KEEP_OUTPUT_DAYS says; the policy takes them once the
    jobs have finished."""
    stack, url = isolated, isolated.settings.database
    home, stack_dir = isolated.home, stack_id(url)
    assert stack.mxq("models", "add", "gcrun", "--arch", "mlp", "--input-shape", "8").returncode == 0
    np.save(stack.home / "data" / "gcrun.npy", np.zeros((400, 8), np.float32))
    infer = stack.mxq_json("infer", "gcrun", "gcrun.npy", "--output", "parquet", "--allow-offline")
    train = stack.mxq_json("train", "mlp", "digits", "--name", "gc-running", "--allow-offline")
    long_ago = utcnow() - timedelta(days=10)
    _set(stack, infer["id"], status=JobStatus.RUNNING, submitted_at=long_ago, started_at=long_ago,
         progress_at=long_ago)
    _set(stack, train["id"], status=JobStatus.QUEUED, submitted_at=long_ago, started_at=long_ago)
    _rows(url, infer["id"], 40)
    parts = output_file(home, stack_dir, infer["id"], ".parquet.parts")
    parts.mkdir(parents=True)
    (parts / "part-000000.parquet").write_bytes(b"p" * 100)
    checkpoint = home / "checkpoints" / stack_dir / f"job-{train['id']}" / "a1" / "epoch-0001.params"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"c" * 100)
    (home / "runs").mkdir(exist_ok=True)
    run_file = home / "runs" / f"job-{train['id']}.a1.json"
    run_file.write_text("{}")
    ours = {str(parts), str(checkpoint.parent.parent), str(run_file), f"job {infer['id']}"}

    said = _gc(stack, "--dry-run", MXQ_KEEP_OUTPUT_DAYS="5")
    done = _gc(stack, MXQ_KEEP_OUTPUT_DAYS="5")
    assert not (_where(said) | _where(done)) & ours, (said, done)
    assert parts.is_dir() and (parts / "part-000000.parquet").is_file()
    assert checkpoint.is_file() and run_file.is_file()
    assert predictions.count(url, infer["id"]) == 40
    assert stack.mxq_json("job", str(infer["id"]))["output_removed_at"] is None

    for job in (infer, train):  # the same jobs, finished 10 days ago: now their files go
        _set(stack, job["id"], status=JobStatus.FAILED, finished_at=long_ago)
    gone = _gc(stack, MXQ_KEEP_OUTPUT_DAYS="5")
    assert {str(parts), str(run_file), f"job {infer['id']}"} <= _where(gone), gone
    assert not parts.exists() and not run_file.exists() and predictions.count(url, infer["id"]) == 0
