"""A paused broker (SIGSTOP: Redis accepts connections and answers nothing) during submissions:
the API and `mxq infer` answer within MXQ_BROKER_TIMEOUT_SECONDS with the job queued and not
published, a retry with the same Idempotency-Key returns that job, and after SIGCONT the
reconciler publishes each job and each runs once."""

from __future__ import annotations

import contextlib
import re
import uuid

import pytest

from tests.api_server import start_api
from tests.conftest import paused
from tests.faults.stacks import FaultStack, PrivateRedis, report

pytestmark = [pytest.mark.slow, pytest.mark.both_legs]

DEADLINE = {"MXQ_BROKER_TIMEOUT_SECONDS": "2"}
TOKEN = "pause-token-5c1d2e3f"
ROWS = 3_000


def _broker_pid(stack: FaultStack) -> int:
    if isinstance(stack.broker_server, PrivateRedis):
        assert stack.broker_server.proc is not None
        return stack.broker_server.proc.pid
    return int((stack.home / "redis.pid").read_text().strip())


def _paused(stack: FaultStack) -> contextlib.AbstractContextManager[None]:
    return paused(_broker_pid(stack))


def test_a_paused_broker_neither_hangs_nor_duplicates_a_submit(faulty: FaultStack) -> None:
    faulty.model()
    faulty.samples("pause.npy", ROWS, seed=4)
    api = start_api(faulty, TOKEN, "api-pause", **DEADLINE)
    server = next(api)
    key = f"pause-{uuid.uuid4()}"
    body = {"kind": "infer", "model": "mlp64", "input": "pause.npy", "device": "auto"}
    headers = {**server.auth, "Idempotency-Key": key}
    try:
        with server.client() as http:  # (its own timeout of 60 s guards against a hang)
            with _paused(faulty):
                first = http.post("/api/v1/jobs", json=body, headers=headers)
                retry = http.post("/api/v1/jobs", json=body, headers=headers)
                cli = faulty.mxq_process("infer", "mlp64", "pause.npy", env=DEADLINE, timeout=60)
            after = http.post("/api/v1/jobs", json=body, headers=headers)
    finally:
        next(api, None)
    assert first.status_code == 201, first.text
    assert first.json()["published"] is False and first.json()["status"] == "queued"
    assert "the reconciler publishes it" in first.json()["note"]
    assert retry.status_code == 200 and retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json()["id"] == first.json()["id"] == after.json()["id"]
    assert cli.returncode == 0, cli.stderr
    assert "not published yet" in cli.stdout
    found = re.search(r"job (\d+) queued", cli.stdout)
    assert found, cli.stdout
    ids = [first.json()["id"], int(found.group(1))]
    done = faulty.wait_all(ids, 300)
    for job_id, record in done.items():
        assert record["status"] == "succeeded" and record["attempts"] == 1, record
        stored, _ = faulty.predicted(job_id)
        assert stored.tolist() == list(range(ROWS))  # once each, in order
    report("broker SIGSTOP during submissions", {
        "backend": faulty.name, "jobs": len(ids), "lost": 0, "duplicated": 0,
        "retry_same_job": True})
