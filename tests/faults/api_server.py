"""The real `mxq api` server as a subprocess for the fault tests, and what "nothing changed" means.

(tests/test_api.py drives the app in-process through TestClient; these tests need the server
process itself: its settings from the environment, its body limit, its output.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import text

from db.engine import get_engine
from tests.conftest import ROOT, Stack, free_port


@dataclass
class Api:
    """A running `mxq api` subprocess and how to talk to it."""

    url: str
    token: str
    proc: subprocess.Popen
    log: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def start_api(stack: Stack, token: str, name: str = "api", **env: str) -> Iterator[Api]:
    """`mxq api` on a free loopback port with MXQ_API_TOKEN set, its output in
    `<home>/<name>-<port>.log`; stopped with SIGTERM afterwards."""
    port = free_port()
    log_path = stack.home / f"{name}-{port}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "api"], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT,
                                env=stack.environ(MXQ_API_TOKEN=token, MXQ_API_PORT=str(port), **env))
    api = Api(f"http://127.0.0.1:{port}", token, proc, log_path)
    deadline = time.monotonic() + 120
    with api.client() as client:
        while True:
            assert proc.poll() is None, f"mxq api exited: {log_path.read_text()}"
            try:
                if client.get("/api/v1/devices").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"mxq api did not answer: {log_path.read_text()}"
            time.sleep(0.2)
    try:
        yield api
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def counts(stack: Stack) -> dict[str, int]:
    """What a refused request must not change: jobs by outcome, models, schedules."""
    queries = {"jobs_not_failed": "SELECT count(*) FROM jobs WHERE status <> 'failed'",
               "jobs_failed": "SELECT count(*) FROM jobs WHERE status = 'failed'",
               "models": "SELECT count(*) FROM models", "schedules": "SELECT count(*) FROM schedules"}
    with get_engine(stack.settings.database).connect() as conn:
        return {k: conn.execute(text(q)).scalar_one() for k, q in queries.items()}
