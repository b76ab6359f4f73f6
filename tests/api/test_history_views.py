"""The SQL views `job_history` and `device_daily` (migration 0012), and the three questions of
docs/sql-history.md answered against them, run as written on both backends."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sqlalchemy import text

from mxq.db.engine import get_engine
from mxq.errors import JobRejected
from mxq.workers.jobs.submit import submit
from tests.conftest import ROOT, Stack

pytestmark = pytest.mark.both_legs  # the views are written per backend


def documented_queries() -> list[str]:
    page = (ROOT / "docs" / "sql-history.md").read_text()
    section = page.split("\n## Three questions\n", 1)[1].split("\n## ", 1)[0]
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
    assert (infer["owner"], infer["priority"], infer["preemptions"]) == (record["owner"], "normal", 0)
    assert infer["owner"] is not None  # submitted here: this machine's local:LOGIN
    assert infer["queue_wait_seconds"] >= 0 and infer["run_seconds"] > 0 and 0 <= infer["age_days"] < 1
    assert len(rows) == _rows(history, "SELECT COUNT(*) AS n FROM jobs")[0]["n"]


def test_the_documented_questions_run_as_written(history: Stack) -> None:
    """Each answer checked against the rows of the views themselves (the session's stack holds
    many other jobs, so which model or error comes first is not known in advance)."""
    slowest, busiest, failures = documented_queries()
    jobs = _rows(history, "SELECT * FROM job_history")

    done = [j for j in jobs if j["kind"] == "infer" and j["status"] == "succeeded" and j["age_days"] < 7]
    rates: dict[str, list[float]] = {}
    for j in done:
        rates.setdefault(j["model"], []).append(j["samples_per_sec"])
    means = {m: sum(known) / len(known) for m, v in rates.items() if (known := [x for x in v if x])}
    models = _rows(history, slowest)  # (AVG leaves out a rate SQL does not have, as here)
    assert "mlp64" in means and len(models) == min(5, len(means))
    for r in models:
        assert r["jobs"] == len(rates[r["model"]])
        assert r["samples_per_sec"] == pytest.approx(means[r["model"]])
    assert [r["samples_per_sec"] for r in models] == pytest.approx(sorted(means.values())[:len(models)])

    busy: dict[tuple[str, str], float] = {}
    for d in _rows(history, "SELECT * FROM device_daily"):
        busy[(d["device"], d["node"])] = busy.get((d["device"], d["node"]), 0.0) + float(d["busy_seconds"])
    [device] = _rows(history, busiest)
    assert float(device["busy_seconds"]) == pytest.approx(max(busy.values()))
    assert float(device["busy_seconds"]) == pytest.approx(busy[(device["device"], device["node"])])

    reasons: dict[str, int] = {}
    for j in jobs:
        if j["status"] == "failed":
            reasons[j["error"]] = reasons.get(j["error"], 0) + 1
    answered = _rows(history, failures)
    assert any("input no-such-file.npy does not exist" in e for e in reasons)
    assert len(answered) == min(10, len(reasons))
    assert all(reasons[r["error"]] == r["jobs"] for r in answered)
    assert [r["jobs"] for r in answered] == sorted(reasons.values(), reverse=True)[:len(answered)]


def test_the_documented_predictions_read_runs_as_written(history: Stack) -> None:
    """docs/sql-history.md's Python decodes a job's blocks into the samples `mxq results` gives."""
    from mxq.db.outputs import predictions

    page = (ROOT / "docs" / "sql-history.md").read_text()
    section = page.split("\n## Predictions in SQL\n", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    url = history.settings.database
    job = max(r["id"] for r in _rows(history, "SELECT id FROM job_history WHERE model = 'mlp64' AND "
                                              "samples = 300 AND status = 'succeeded'"))
    raw = get_engine(url).raw_connection()
    try:
        found: dict = {"conn": raw.driver_connection}
        exec(code.replace("job_id = 42", f"job_id = {job}"), found)  # (the page's own code)
    finally:
        raw.close()
    stored = predictions.read(url, job)
    assert len(stored) == 300
    assert found["index"].tolist() == [r["index"] for r in stored]
    assert found["classes"].tolist() == [r["predicted_class"] for r in stored]
    assert found["scores"].tolist() == [r["score"] for r in stored]
