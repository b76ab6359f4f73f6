"""The SQL views `job_history` and `device_daily` (migration 0012), and the README's three
questions answered against them, run as written on both backends."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sqlalchemy import text

from mxq.db.engine import get_engine
from mxq.errors import JobRejected
from mxq.workers.submit import submit
from tests.conftest import ROOT, Stack

pytestmark = pytest.mark.both_legs  # the views are written per backend


def readme_queries() -> list[str]:
    section = (ROOT / "README.md").read_text().split("### SQL views", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def _rows(stack: Stack, sql: str) -> list[dict]:
    with get_engine(stack.settings.database).connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql))]


@pytest.fixture
def history(workers: Stack, mlp: dict) -> Stack:
    """A finished probe on each device, a finished inference, a job refused at submit."""
    s = workers.settings
    np.save(workers.home / "data" / "views.npy", np.ones((300, 64), np.float32))
    done = [submit(s, "probe", {"size": 32, "batch": 1, "repeat": 1}, d) for d in ("cpu:0", "cpu:1")]
    done.append(submit(s, "infer", {"model": "mlp64", "input": "views.npy"}, "cpu:0"))
    for job_id in done:
        assert workers.wait(job_id)["status"] == "succeeded"
    with pytest.raises(JobRejected):
        submit(s, "infer", {"model": "mlp64", "input": "no-such-file.npy"}, "cpu:0")
    return workers


def test_job_history_has_a_row_per_job_with_its_times(history: Stack) -> None:
    rows = {r["id"]: r for r in _rows(history, "SELECT * FROM job_history")}
    infer = max((r for r in rows.values() if r["kind"] == "infer" and r["status"] == "succeeded"),
                key=lambda r: r["id"])
    record = history.job(infer["id"])
    assert (infer["model"], infer["model_version"], infer["device"]) == ("mlp64", 1, "cpu:0")
    assert infer["samples"] == record["samples"] == 300
    assert infer["queue_wait_seconds"] >= 0 and infer["run_seconds"] > 0 and 0 <= infer["age_days"] < 1
    assert len(rows) == _rows(history, "SELECT COUNT(*) AS n FROM jobs")[0]["n"]


def test_the_readme_questions_run_as_written(history: Stack) -> None:
    slowest, busiest, failures = readme_queries()
    models = _rows(history, slowest)
    assert "mlp64" in {r["model"] for r in models} and all(r["samples_per_sec"] > 0 for r in models)
    [device] = _rows(history, busiest)
    assert device["device"] in ("cpu:0", "cpu:1") and device["jobs"] >= 1 and device["busy_seconds"] > 0
    reasons = {r["error"]: r["jobs"] for r in _rows(history, failures)}
    assert any("input no-such-file.npy does not exist" in e for e in reasons), reasons
