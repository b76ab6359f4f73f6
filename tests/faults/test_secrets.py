"""Secrets stay secret: with a database password and an API token in the environment, a stack that
runs jobs and answers the API writes neither into its logs, its output, its database rows (job
params, results, errors, events) nor anywhere else under its home."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.engine import make_url

from mxq.db.engine import get_engine
from mxq.db.reports.history import JobFilter, list_jobs, require_job
from tests.api_server import start_api
from tests.conftest import FINAL, Stack, _stack, launch, stop, wait_until

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

pytestmark = [pytest.mark.slow, pytest.mark.both_legs]

PASSWORD = "S3cretPw123"  # PostgreSQL on 127.0.0.1 trusts local connections, so any password works
TOKEN = "tok-9f3cQ7vLx2Zr"


@pytest.fixture(params=["embedded", "system"])
def secret_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """A stack whose MXQ_API_TOKEN is set and (system leg) whose database URL has a password.

    The embedded leg's SQLite URL cannot carry a password, so there only the token is tracked."""
    gen = _stack(request.param, tmp_path, 11)  # a missing server skips (fails in CI) via missing()
    stack = next(gen)
    if stack.name == "system":
        url = make_url(stack.settings.database).set(username="postgres", password=PASSWORD)
        stack.env["MXQ_DATABASE_URL"] = url.render_as_string(hide_password=False)
        assert PASSWORD in stack.settings.database
    stack.env["MXQ_API_TOKEN"] = TOKEN
    try:
        yield stack
    finally:
        get_engine(stack.settings.database).dispose()
        next(gen, None)


def _wait(stack: Stack, job_id: int) -> JobRecord:
    return wait_until(lambda: stack.job(job_id), 180, f"job {job_id} to finish",
                      until=lambda record: record["status"] in FINAL)


def _exercise(stack: Stack, outputs: list[str]) -> None:
    """Jobs through the CLI and the API, good and bad, and the commands that print settings."""

    def mxq(*args: str) -> str:
        proc = stack.mxq_process(*args)  # everything the real program prints, logging included
        outputs.append(proc.stdout + proc.stderr)
        return proc.stdout

    json.loads(mxq("models", "add", "mlp64", "--arch", "mlp", "--input-shape", "64", "--json"))
    np.save(stack.home / "data" / "ok.npy", np.ones((50, 64), np.float32))
    np.save(stack.home / "data" / "narrow.npy", np.ones((5, 32), np.float32))
    assert json.loads(mxq("infer", "mlp64", "ok.npy", "--wait", "--json"))["status"] == "succeeded"
    mxq("infer", "mlp64", "missing.npy")  # refused at submit: a failed job with an error
    mxq("probe", "--size", "64", "--repeat", "1", "--device", "cpu:1", "--wait")
    mxq("worker", "--dry-run", "--json")  # prints each worker's MXQ_* environment
    mxq("devices", "--json")
    mxq("jobs", "--json")
    for api in start_api(stack, TOKEN, "api-secrets"):
        with api.client() as client:
            for body in ({"kind": "probe", "size": 64, "repeat": 1},
                         {"kind": "infer", "model": "mlp64", "input": "narrow.npy"},  # fails on a worker
                         {"kind": "train", "arch": "mlp", "dataset": "digits", "name": "secret-test",
                          "epochs": 1}):
                r = client.post("/api/v1/jobs", json=body, headers=api.auth)
                assert r.status_code == 201, r.text
                _wait(stack, r.json()["id"])
            r = client.post("/api/v1/jobs", json={"kind": "probe"},
                            headers={"Authorization": f"Bearer {TOKEN}x"})  # a wrong token
            assert r.status_code == 401
            outputs.append(r.text)
            for path in ("/api/v1/jobs", "/api/v1/devices", "/api/v1/models", "/metrics", "/openapi.json"):
                outputs.append(client.get(path).text)


def _rows(stack: Stack) -> dict[str, list[str]]:
    """Every row of every table, as text."""
    engine = get_engine(stack.settings.database)
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        return {t.name: [repr(tuple(row)) for row in conn.execute(select(t))] for t in meta.sorted_tables}


def test_no_secret_in_logs_output_or_rows(secret_stack: Stack) -> None:
    stack = secret_stack
    secrets = {"API token": TOKEN, **({"database password": PASSWORD} if stack.name == "system" else {})}
    outputs: list[str] = []
    launcher = launch(stack, "--with-schedule")
    try:
        _exercise(stack, outputs)
    finally:
        stop(launcher)

    records = [require_job(stack.settings.database, j["id"], with_metrics=True)
               for j in list_jobs(stack.settings.database, JobFilter(limit=10_000))]
    assert {r["status"] for r in records} == {"succeeded", "failed"} and len(records) == 6, records
    assert all(isinstance(r.get("events", []), list) for r in records)
    files = [p for p in stack.home.rglob("*") if p.is_file()]
    logs = [p for p in files if p.suffix == ".log"]
    assert stack.home / "launcher-test.log" in logs and any(p.parent.name == "logs" for p in logs)
    tables = _rows(stack)
    leaks = []
    for what, secret in secrets.items():
        leaks += [f"{what} in {p.relative_to(stack.home)}" for p in files
                  if secret.encode() in p.read_bytes()]
        leaks += [f"{what} in job {r['id']}" for r in records if secret in json.dumps(r)]
        leaks += [f"{what} in table {t}" for t, rows in tables.items() if any(secret in x for x in rows)]
        leaks += [f"{what} in command output {i}: {out[:2000]}" for i, out in enumerate(outputs)
                  if secret in out]
    assert not leaks, "\n".join(leaks)
