"""A throwaway embedded stack with one launcher, and the helpers the benchmarks share."""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxq.db.fleet import alive_since, list_workers
from mxq.db.migrate import upgrade
from mxq.db.schema import as_utc, utcnow
from mxq.status import FINISHED
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.settings import Settings

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180.0  # workers import MXNet; on a busy machine that takes a while
FINAL = FINISHED  # a job's last statuses (mxq.status)


@contextmanager
def scratch(root: Path | None = None, prefix: str = "mxq-bench-") -> Iterator[Path]:
    """A fresh folder (under `root` when given), removed afterwards unless the body failed: then
    it is kept, with its logs, and its path printed."""
    if root is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)
        return
    root.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    try:
        yield home
    except BaseException:
        print(f"  (kept {home} for its logs)", flush=True)
        raise
    shutil.rmtree(home, ignore_errors=True)


@contextmanager
def running_stack(cpu_devices: int = 1, node: str = "bench", root: Path | None = None,
                  env: dict[str, str] | None = None, prefix: str = "mxq-bench-") -> Iterator[Settings]:
    """Embedded Redis + SQLite + `mxq worker` with `cpu_devices` CPU devices, all torn down after.

    Its home is a fresh folder (under `root` when given); `env` adds MXQ_* settings for the
    workers, such as MXQ_DYNAMIC_BATCHING=0.
    """
    with scratch(root, prefix) as home:
        extra = dict(env or {})
        child = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
        child.update(MXQ_HOME=str(home), MXQ_NODE=node, MXQ_CPU_DEVICES=str(cpu_devices),
                     MXQ_DATA_ROOT=str(home), MXQ_NVIDIA_SMI=str(home / "none"), **extra)
        # pydantic parses each value as the environment's would be
        fields: dict[str, Any] = {k.removeprefix("MXQ_").lower(): v for k, v in extra.items()
                                  if k.startswith("MXQ_")}
        fields = {"broker_url": None, "database_url": None, **fields}  # embedded unless `env` says
        settings = Settings(home=home, node=node, cpu_devices=cpu_devices, data_root=home,
                            nvidia_smi=str(home / "none"), **fields)
        redis = EmbeddedRedis(home)
        redis.start()
        upgrade(settings.database)
        since = utcnow()
        log = open(home / "launcher.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker"], cwd=ROOT, env=child,
                                stdout=log, stderr=subprocess.STDOUT)
        log.close()
        names = [f"cpu{i}@{node}" for i in range(cpu_devices)]
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while alive_since(settings.database, names, since, settings.heartbeat_ttl) != set(names):
                if proc.poll() is not None:
                    raise RuntimeError("the launcher exited; see its logs in " + str(home / "logs"))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workers not up after {START_TIMEOUT:.0f}s; see {home / 'logs'}")
                time.sleep(0.2)
            yield settings
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            redis.stop()
            from mxq.db.engine import get_engine

            get_engine(settings.database).dispose()


def free_port() -> int:
    """A TCP port on loopback that no one listens on now (for a server a case starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_pids(settings: Settings) -> dict[str, int]:
    return {w["device"]: w["pid"] for w in list_workers(settings.database, settings.heartbeat_ttl)
            if w["pid"] is not None}


def worker_cores(settings: Settings, device: str = "cpu:0") -> list[int]:
    """The cores the launcher pinned `device`'s worker to."""
    return sorted(os.sched_getaffinity(worker_pids(settings)[device]))


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def wait_job(settings: Settings, job_id: int, timeout: float = 3600, poll: float = 0.5) -> JobRecord:
    from mxq.db.reports.history import require_job

    deadline = time.monotonic() + timeout
    while (record := require_job(settings.database, job_id))["status"] not in FINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {record['status']}")
        time.sleep(poll)  # polling more often would take CPU from the job being measured
    if record["status"] != "succeeded":
        raise RuntimeError(f"job {job_id} {record['status']}: {record['error']}")
    return record


def rate(job: JobRecord) -> float:
    """A succeeded job's samples/s (`wait_job`'s jobs all have one)."""
    assert job["samples_per_sec"] is not None, job
    return job["samples_per_sec"]


def wait_jobs(settings: Settings, ids: Sequence[int], timeout: float = 3600,
              poll: float = 0.5) -> list[dict[str, Any]]:
    """Wait until every job is over; their times (UTC datetimes) and results, in id order.

    Raises if any failed: a benchmark of failing jobs measures nothing."""
    from sqlalchemy import func, select

    from mxq.db.engine import session_scope
    from mxq.db.schema import Job

    deadline = time.monotonic() + timeout
    while True:
        with session_scope(settings.database) as s:
            left = s.scalar(select(func.count()).where(Job.id.in_(ids), Job.status.not_in(FINAL)))
        if not left:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} of {len(ids)} jobs still not finished")
        time.sleep(poll)
    with session_scope(settings.database) as s:
        rows = [{"id": j.id, "status": str(j.status), "error": j.error, "device": j.device,
                 "submitted_at": as_utc(j.submitted_at), "started_at": as_utc(j.started_at),
                 "finished_at": as_utc(j.finished_at), "result": j.result or {}}
                for j in s.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id))]
    bad = [r for r in rows if r["status"] != "succeeded"]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(ids)} jobs did not succeed; job {bad[0]['id']}: "
                           f"{bad[0]['status']}: {bad[0]['error']}")
    return rows


def children(settings: Settings, parent_id: int) -> list[dict[str, Any]]:
    """The chunk jobs of a split job: device, start and finish."""
    from sqlalchemy import select

    from mxq.db.engine import session_scope
    from mxq.db.schema import Job

    with session_scope(settings.database) as s:
        return [{"id": j.id, "device": j.device, "started_at": as_utc(j.started_at),
                 "finished_at": as_utc(j.finished_at)}
                for j in s.scalars(select(Job).where(Job.parent_id == parent_id)
                                   .order_by(Job.chunk_index))]


def pinned_env(cores: Sequence[int]) -> dict[str, str]:
    """The thread limits the launcher gives a CPU device worker on `cores` (workers.launcher)."""
    from mxq.workers.hardware.pinning import THREAD_VARS

    env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
    env.update({var: str(len(cores)) for var in THREAD_VARS}, MXNET_CPU_WORKER_NTHREADS="1",
               CUDA_VISIBLE_DEVICES="")
    return env


def run_pinned(args: Sequence[str], cores: Sequence[int]) -> str:
    """`python ARGS` in a process pinned to `cores` with a worker's thread limits; its stdout."""
    cores = list(cores)
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=pinned_env(cores),
                         capture_output=True, text=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, cores))
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {out.returncode}: {out.stderr[-2000:]}")
    return out.stdout


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """p50 and p95 (with fewer than 2 values, both are the value)."""
    if len(values) < 2:
        v = float(values[0]) if values else float("nan")
        return {"p50": v, "p95": v}
    return {"p50": statistics.median(values), "p95": statistics.quantiles(values, n=20)[18]}
