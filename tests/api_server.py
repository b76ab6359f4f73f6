"""The real `mxq api` server as a subprocess, and what "nothing changed" means after a bad request.

(Most API tests drive the app in-process through TestClient; the round trips of the bad-input
corpus and the secrets test need the server process itself: its settings from the environment,
its body limit, its output.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import text

from mxq.db.engine import get_engine
from tests.conftest import ROOT, Stack, free_port, wait_until


@dataclass
class Api:
    """A running `mxq api` subprocess and how to talk to it."""

    url: str
    token: str | None
    proc: subprocess.Popen
    log: Path

    def client(self, token: bool = True) -> httpx.Client:
        """A client of the API; with its token (reads need one too) unless `token` is False."""
        headers = self.auth if token and self.token else {}
        return httpx.Client(base_url=self.url, timeout=60, headers=headers)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def start_api(stack: Stack, token: str | None, name: str = "api", **env: str) -> Iterator[Api]:
    """`mxq api` on a free loopback port with MXQ_API_TOKEN set (unless None), its output in
    `<home>/<name>-<port>.log`; stopped with SIGTERM afterwards."""
    port = free_port()
    log_path = stack.home / f"{name}-{port}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "api"], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT,
                                env=stack.environ(**({"MXQ_API_TOKEN": token} if token else {}),
                                                  MXQ_API_PORT=str(port), **env))
    api = Api(f"http://127.0.0.1:{port}", token, proc, log_path)
    with api.client() as client:

        def answer() -> int | str:  # the status code, or the error of this try
            assert proc.poll() is None, f"mxq api exited: {log_path.read_text()}"
            try:
                return client.get("/api/v1/devices").status_code
            except httpx.TransportError as exc:
                return repr(exc)

        wait_until(answer, 120, f"mxq api to answer /api/v1/devices with 200 (its log: {log_path})",
                   until=lambda code: code == 200, interval=0.2)
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
