"""Flower (the `flower` extra), started against a running stack with the settings it needs, as
compose starts it (FLOWER_BASIC_AUTH), refuses a request without its credentials and, with them,
finds mxq's device workers in `/api/workers` and mxq's jobs in `/api/tasks`."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from mxq.workers.jobs.submit import submit
from tests.conftest import NODE, ROOT, Stack, free_port, wait_until

pytestmark = pytest.mark.slow


AUTH = ("ops", "flower-secret")


def _get(url: str) -> Any:  # the JSON answer, or None
    try:
        answer = httpx.get(url, timeout=10, auth=AUTH)
        return answer.json() if answer.status_code == 200 else None
    except (httpx.TransportError, ValueError):
        return None


def test_flower_sees_the_workers_and_the_jobs(workers: Stack, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "flower.log"
    with open(log, "wb") as out:
        flower = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "mxq.workers", "flower", "--address=127.0.0.1",
             f"--port={port}", f"--db={tmp_path / 'flower.db'}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env=workers.environ(FLOWER_BASIC_AUTH=":".join(AUTH)))
    url = f"http://127.0.0.1:{port}"
    try:
        names = {f"cpu0@{NODE}", f"cpu1@{NODE}"}
        seen = wait_until(lambda: _get(f"{url}/api/workers?refresh=1"), 120, "Flower to list the workers",
                          until=lambda w: isinstance(w, dict) and names <= set(w), interval=1.0)
        assert names <= set(seen), log.read_text()
        for path in ("/api/workers", "/api/tasks", "/"):  # the credentials are what opened them
            assert httpx.get(url + path, timeout=10).status_code == 401, path
            assert httpx.get(url + path, timeout=10, auth=("ops", "wrong")).status_code == 401, path
        job_id = submit(workers.settings, "probe", {"size": 32, "batch": 1, "repeat": 1}, "cpu:1")
        assert workers.wait(job_id)["status"] == "succeeded"
        tasks = wait_until(lambda: _get(f"{url}/api/tasks"), 60, f"Flower to show job {job_id}",
                           until=lambda t: isinstance(t, dict) and f"job-{job_id}" in t, interval=0.5)
        task = tasks[f"job-{job_id}"]
        assert task["name"] == "mxq.probe" and task["state"] == "SUCCESS" and task["worker"] == f"cpu1@{NODE}"
    finally:
        flower.send_signal(signal.SIGTERM)
        flower.wait(timeout=30)
