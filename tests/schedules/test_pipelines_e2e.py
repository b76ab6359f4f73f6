"""Work that follows work, through real processes: a scheduled retraining registers and
promotes versions, an inference schedule run by the real schedule process (`mxq scheduler`)
scores each new file once with the promoted version, both killed with SIGKILL mid-fire and
mid-job, and a promotion re-scores the standing inputs at low priority."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select, text

from mxq.db.engine import session_scope
from mxq.db.outputs import predictions
from mxq.db.records import JobRecord
from mxq.db.registry import list_models
from mxq.db.schema import Job, ScoredInput
from tests.conftest import ROOT, Stack, wait_until
from tests.support.workers import pid_of, wait_alive

pytestmark = [pytest.mark.both_legs, pytest.mark.slow]  # long real-process work: make test-all
FILES, ROWS = 40, 100


@contextmanager
def scheduler(stack: Stack) -> Iterator[subprocess.Popen[bytes]]:
    """`mxq scheduler` (beat and the control worker) ticking every second, in a process group of
    its own, so a SIGKILL takes its beat too."""
    proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "scheduler"], cwd=ROOT,
                            env=stack.environ(MXQ_TICK_SECONDS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


def _claims(stack: Stack, model: str, version: int) -> int:
    with session_scope(stack.settings.database) as session:
        return int(session.scalar(select(func.count()).select_from(ScoredInput).where(
            ScoredInput.model == model, ScoredInput.version == version)) or 0)


def _running(stack: Stack) -> str | None:
    """The worker of a running job of an inference fire, if one runs now."""
    with session_scope(stack.settings.database) as session:
        return session.scalar(select(Job.worker).join(ScoredInput, ScoredInput.job_id == Job.id)
                              .where(Job.status == "running", Job.worker.is_not(None)).limit(1))


def _jobs_by_file(stack: Stack, schedule: str) -> dict[str, list[JobRecord]]:
    shown = stack.mxq_json("schedule", "show", schedule)
    found: dict[str, list[JobRecord]] = {}
    for fire in shown["fires"]:
        for job_id in fire["jobs"]:
            job = stack.job(job_id)
            found.setdefault(Path(job["params"]["input"]).name, []).append(job)
    return found


def _retrain(stack: Stack) -> int:
    fire = stack.mxq_json("schedule", "run-now", "pipe-retrain")
    done = stack.wait(fire["job_id"], timeout=300)
    assert done["status"] == "succeeded", done["error"]
    return int((done["result"] or {})["model_version"])


@pytest.fixture
def cleanup(workers: Stack) -> Iterator[None]:
    """The session's stack is shared: its other tests' ticks must not fire these schedules."""
    yield
    for name in ("pipe-score", "pipe-retrain"):
        workers.mxq("schedule", "rm", name)


@pytest.mark.usefixtures("cleanup")
def test_new_files_scored_once_through_kills_and_rescored_on_promotion(workers: Stack) -> None:
    added = workers.mxq("schedule", "add", "pipe-retrain", "--arch", "mlp", "--model", "pipe-e2e",
                        "--dataset", "digits", "--cron", "0 3 * * *", "--epochs", "1",
                        "--promote", "always")
    assert added.returncode == 0, added.stderr
    assert _retrain(workers) == 1
    shape = list_models(workers.settings.database, "pipe-e2e")[0]["input_shape"]
    inbox = workers.home / "data" / "pipe-inbox"
    inbox.mkdir()
    for i in range(FILES):
        np.save(inbox / f"batch{i:02}.npy",
                np.random.default_rng(i).uniform(0, 16, size=(ROWS, *shape)).astype(np.float32))
    added = workers.mxq("schedule", "add", "pipe-score", "--infer", "pipe-e2e", "--input",
                        "pipe-inbox/*.npy", "--every", "10s")
    assert added.returncode == 0, added.stderr

    with scheduler(workers) as first:  # killed once it has claimed some files, not all
        at_kill = wait_until(lambda: _claims(workers, "pipe-e2e", 1), 120, "the fire to start",
                             until=lambda n: n >= 3, interval=0.005)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert at_kill < FILES
    with scheduler(workers):
        worker = wait_until(lambda: _running(workers), 180, "a fire's job to run", interval=0.02)
        pid = pid_of(workers, worker)
        os.kill(pid, signal.SIGKILL)  # mid-job: it is queued again and resumes
        wait_alive(workers, worker, pid)
        scored = wait_until(lambda: _jobs_by_file(workers, "pipe-score"), 300, "every file's job",
                            until=lambda found: len(found) == FILES and all(
                                j["status"] == "succeeded" for jobs in found.values() for j in jobs),
                            interval=0.5)
        for name, jobs in scored.items():
            assert len(jobs) == 1, (name, [j["id"] for j in jobs])
            _exactly_once(workers, jobs[0])

        assert _retrain(workers) == 2  # `--promote always`: version 2 is promoted
        again = wait_until(lambda: _jobs_by_file(workers, "pipe-score"), 300,
                           "the promotion to re-score every file",
                           until=lambda found: all(len(jobs) == 2 and all(
                               j["status"] == "succeeded" for j in jobs) for jobs in found.values()),
                           interval=0.5)
    for name, (old, new) in again.items():
        assert (old["params"]["model_version"], new["params"]["model_version"]) == (1, 2), name
        assert new["priority"] == "low" and old["priority"] == "normal"
        _exactly_once(workers, old)  # the first version's rows stay beside the second's
        _exactly_once(workers, new)
    fires = workers.mxq_json("schedule", "show", "pipe-score")["fires"]
    assert [f["rescore_version"] for f in fires if f["rescore_version"]] == [2]
    _lineage_answers(workers, inbox, again)


def _lineage_answers(stack: Stack, inbox: Path, scored: dict[str, list[JobRecord]]) -> None:
    """The three questions, checked against the files: what produced this output, which
    outputs came from version N, which inputs the promoted version has not scored."""
    for name, jobs in scored.items():
        for job in jobs:
            line = stack.mxq_json("lineage", str(job["id"]))
            data = (inbox / name).read_bytes()
            assert line["input"] == str(inbox / name) and line["schedule"] == "pipe-score"
            assert line["input_bytes"] == f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
            assert line["model_version"] == job["params"]["model_version"] and line["output"] == "db"
            assert line["variant"] and line["engine"] and line["mxq_version"]
    for version in (1, 2):
        made = {r["job_id"] for r in stack.mxq_json("lineage", "--model", f"pipe-e2e:{version}")}
        assert made == {jobs[version - 1]["id"] for jobs in scored.values()}
        with session_scope(stack.settings.database) as session:  # the view, as a BI tool reads it
            viewed = set(session.scalars(text(
                "SELECT job_id FROM prediction_lineage WHERE model = 'pipe-e2e' AND "
                f"model_version = {version}")))
        assert viewed == made
    assert stack.mxq_json("lineage", "--unscored", "pipe-score")["inputs"] == []
    late = inbox / "late.npy"
    np.save(late, np.zeros((ROWS, 1), np.float32))
    for asked in ((), ("--version", "1")):
        missing = stack.mxq_json("lineage", "--unscored", "pipe-score", *asked)
        assert [i["location"] for i in missing["inputs"]] == [str(late)]
        assert missing["version"] == (int(asked[1]) if asked else 2)


def _exactly_once(stack: Stack, job: JobRecord) -> None:
    rows = predictions.read(stack.settings.database, job["id"])
    assert sorted(r["index"] for r in rows) == list(range(ROWS)), job["id"]
