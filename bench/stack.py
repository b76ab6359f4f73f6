"""A throwaway embedded stack with one launcher, for benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from db.migrate import upgrade
from db.schema import utcnow
from db.workers import alive_since, list_workers
from workers.embedded import EmbeddedRedis
from workers.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def running_stack(cpu_devices: int = 1, node: str = "bench") -> Iterator[Settings]:
    """Embedded Redis + SQLite + `mxq worker` with `cpu_devices` CPU devices, all torn down after."""
    with tempfile.TemporaryDirectory(prefix="mxq-bench-") as tmp:
        home = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
        env.update(MXQ_HOME=str(home), MXQ_NODE=node, MXQ_CPU_DEVICES=str(cpu_devices),
                   MXQ_DATA_ROOT=str(home), MXQ_NVIDIA_SMI=str(home / "none"))
        settings = Settings(home=home, node=node, cpu_devices=cpu_devices, data_root=home,
                            nvidia_smi=str(home / "none"))
        redis = EmbeddedRedis(home)
        redis.start()
        upgrade(settings.database)
        since = utcnow()
        proc = subprocess.Popen([sys.executable, "-m", "cli", "worker"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        names = [f"cpu{i}@{node}" for i in range(cpu_devices)]
        try:
            while alive_since(settings.database, names, since, settings.heartbeat_ttl) != set(names):
                if proc.poll() is not None:
                    raise RuntimeError("the launcher exited; see its logs in " + str(home / "logs"))
                time.sleep(0.2)
            yield settings
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            redis.stop()


def worker_pids(settings: Settings) -> dict[str, int]:
    return {w["device"]: w["pid"] for w in list_workers(settings.database, settings.heartbeat_ttl)}


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def wait_job(settings: Settings, job_id: int, timeout: float = 3600) -> dict:
    from db.history import get_job

    deadline = time.monotonic() + timeout
    while (record := get_job(settings.database, job_id))["status"] not in ("succeeded", "failed"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {record['status']}")
        time.sleep(0.5)  # polling more often would take CPU from the job being measured
    if record["status"] != "succeeded":
        raise RuntimeError(f"job {job_id} failed: {record['error']}")
    return record
