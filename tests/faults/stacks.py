"""Stacks whose servers the fault tests may break (`faulty` in conftest.py): a broker
they can restart (the embedded Redis, or a private `redis-server` with no persistence, so a
restart loses every message) and a launcher with the schedule process, whose reconciler runs
every 2 s."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mxq.db.engine import session_scope
from mxq.db.outputs import predictions
from mxq.db.schema import Job, WorkerBeat
from mxq.json_types import JsonValue
from mxq.workers.launch.embedded import EmbeddedRedis
from tests.conftest import FINAL, Stack, _stack, free_port, launch, missing, stop, wait_until

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

# Heartbeats every second (taken for dead after 5 s): a worker busy writing under SIGKILLs all
# around must not be taken for dead while it lives. The launcher requeues a killed worker's job
# at once whatever the interval.
FAULT_ENV = {"MXQ_RECONCILE_SECONDS": "2", "MXQ_TICK_SECONDS": "3600", "MXQ_MAX_ATTEMPTS": "5",
             "MXQ_HEARTBEAT_SECONDS": "1"}
FEATURES = 64


class PrivateRedis:
    """The machine's `redis-server` on a port of our own, keeping nothing on disk."""

    def __init__(self, home: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            missing("no redis-server program on PATH for the restartable system broker")
        self.binary, self.port, self.home = binary, free_port(), home
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.home)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
        for _ in range(100):
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


def _zombie_or_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (FileNotFoundError, IndexError):
        return True


class FaultStack(Stack):
    broker_server: EmbeddedRedis | PrivateRedis
    launcher: subprocess.Popen

    def restart_broker(self, down_seconds: float = 2.0) -> None:
        self.broker_server.stop()
        time.sleep(down_seconds)
        self.broker_server.start()

    def worker_pid(self, name: str) -> int | None:
        with session_scope(self.settings.database) as s:
            row = s.get(WorkerBeat, name)
            return row.pid if row is not None and row.last_seen is not None else None

    def signal_worker(self, name: str, sig: int) -> int | None:
        """Send `sig` to the live worker `name`: its pid, or None when it is not live
        (restarting, or dead and not yet reaped by its launcher)."""
        pid = self.worker_pid(name)
        if pid is None or _zombie_or_gone(pid):
            return None
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
        return pid

    def kill_worker(self, name: str) -> bool:
        """SIGKILL the live worker `name`; False when it is not live."""
        return self.signal_worker(name, signal.SIGKILL) is not None

    def statuses(self, ids: list[int]) -> dict[int, str]:
        with session_scope(self.settings.database) as s:
            return dict(s.query(Job.id, Job.status).filter(Job.id.in_(ids)).all())

    def wait_all(self, ids: list[int], timeout: float) -> dict[int, JobRecord]:

        def unfinished() -> dict:  # how many are not final, and the first ten of them
            left = [(i, v) for i, v in self.statuses(ids).items() if v not in FINAL]
            return {"unfinished": len(left), "first": left[:10]}

        wait_until(unfinished, timeout, f"{len(ids)} jobs to finish",
                   until=lambda left: left["unfinished"] == 0, interval=0.5)
        return {i: self.job(i) for i in ids}

    def model(self, name: str = "mlp64") -> None:
        proc = self.mxq("models", "add", name, "--arch", "mlp", "--input-shape", str(FEATURES),
                        "--classes", "10", "--json")
        assert proc.returncode == 0, proc.stderr

    def samples(self, name: str, count: int, seed: int = 0) -> str:
        data = np.random.default_rng(seed).normal(size=(count, FEATURES)).astype(np.float32)
        np.save(self.home / "data" / name, data)
        return name

    def infer(self, model: str, input_name: str, device: str = "auto", **params: JsonValue) -> int:
        from mxq.workers.jobs.submit import submit

        return submit(self.settings, "infer", {"model": model, "input": input_name, **params}, device,
                      allow_offline=True)

    def predicted(self, job_id: int) -> tuple[np.ndarray, np.ndarray]:
        """The stored (index, class) pairs of a job, in index order."""
        rows = [(r["index"], r["predicted_class"]) for r in predictions.read(self.settings.database, job_id)]
        array = np.array(rows, dtype=np.int64).reshape(-1, 2)
        return array[:, 0], array[:, 1]


def fault_stack(backend: str, tmp: Path) -> Iterator[FaultStack]:
    gen = _stack(backend, tmp, 9)
    base = next(gen)
    stack = FaultStack(base.name, base.home, base.env)
    if backend == "embedded":
        stack.broker_server = EmbeddedRedis(stack.home)
    else:
        stack.broker_server = PrivateRedis(stack.home)
        stack.broker_server.start()
        stack.env["MXQ_BROKER_URL"] = stack.broker_server.url
    stack.env.update(FAULT_ENV)
    try:
        stack.launcher = launcher = launch(stack, "--with-schedule")
        try:
            yield stack
        finally:
            stop(launcher)
    finally:
        if backend != "embedded":
            stack.broker_server.stop()
        next(gen, None)


def report(name: str, row: dict) -> None:
    """Add one row to the fault table (var/test-artifacts/faults.jsonl) for the closing note."""
    out = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "faults.jsonl", "a") as f:
        f.write(json.dumps({"fault": name, **row}) + "\n")
    print(name, row)

