"""Dispatch: tiny jobs per second through mxq against bare Celery no-op tasks on the same
broker, and submit-to-start latency on an idle worker, same run.

mxq: `probe` jobs of size 16, repeat 1, batch 1 (a few milliseconds of MXNet each), queued with
one `submit_many` on a one-device stack. Bare: a no-op task (bench/dispatch/noop_app.py, mxq's
transport settings) run by `celery worker --pool solo` with the worker's flags, on the same
embedded Redis and the same cores. Latency: jobs submitted one at a time with a pause between,
submitted_at -> started_at from the job's row (bare: send time -> task start).

    python -m bench.dispatch.case [--jobs 500] [--latency-jobs 50]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.dispatch import noop_app
from bench.stack import ROOT, pinned_env, quantiles, running_stack, wait_job, wait_jobs, worker_cores
from mxq.db.schema import utcnow
from mxq.workers.settings import Settings

PROBE = {"size": 16, "repeat": 1, "batch": 1}
PAUSE_SECONDS = 0.2  # between latency samples: the worker is idle again when the next arrives


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def mxq_rate(s: Settings, n: int) -> dict[str, Any]:
    from mxq.workers.jobs.submit import submit_many

    t0 = utcnow()
    ids = submit_many(s, "probe", [dict(PROBE) for _ in range(n)], "auto")
    submitted = utcnow()
    rows = wait_jobs(s, ids, poll=0.2)
    end = max(r["finished_at"] for r in rows)
    runs = sorted(_seconds(r["started_at"], r["finished_at"]) for r in rows)
    return {"jobs": n, "jobs_per_sec": n / _seconds(t0, end),
            "submit_seconds": _seconds(t0, submitted),
            "job_ms_p50": quantiles(runs)["p50"] * 1000}


def mxq_latency(s: Settings, n: int) -> dict[str, float]:
    from mxq.workers.jobs.submit import submit

    ids = []
    for _ in range(n):
        ids.append(submit(s, "probe", dict(PROBE), "auto"))
        wait_job(s, ids[-1], poll=0.05)
        time.sleep(PAUSE_SECONDS)
    rows = wait_jobs(s, ids)
    return {k: v * 1000 for k, v in quantiles([_seconds(r["submitted_at"], r["started_at"])
                                                for r in rows]).items()}


class BareCelery:
    """The no-op worker on the stack's broker, pinned to `cores`, and a publisher for it."""

    def __init__(self, s: Settings, cores: list[int]) -> None:
        import redis
        from celery import Celery

        from mxq.workers.broker.app import celery_config

        self.redis = redis.Redis(unix_socket_path=str(s.redis_socket))
        self.app = Celery("bench-publisher")
        self.app.conf.update({k: v for k, v in celery_config(s).items() if k != "beat_schedule"})
        env = {**pinned_env(cores), "BENCH_BROKER": s.broker, "BENCH_REDIS": f"unix://{s.redis_socket}"}
        self.log = s.home_path / "noop-worker.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench.dispatch.noop_app", "worker", "--pool", "solo",
                 "--concurrency", "1", "--prefetch-multiplier", "1", "-Q", noop_app.QUEUE,
                 "-n", "noop@bench", "--without-gossip", "--without-mingle", "-E", "-l", "WARNING"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=lambda: os.sched_setaffinity(0, cores))
        self._send(1)
        self._wait(1, timeout=120)  # started and consuming

    def _count(self) -> int:
        return int(self.redis.get(noop_app.COUNT) or 0)

    def _send(self, n: int, stamped: bool = False) -> None:
        with self.app.producer_or_acquire() as producer:
            for _ in range(n):
                self.app.send_task(noop_app.TASK, args=[time.time()] if stamped else [],
                                   queue=noop_app.QUEUE, producer=producer)

    def _wait(self, count: int, timeout: float = 600, poll: float = 0.01) -> None:
        deadline = time.monotonic() + timeout
        while self._count() < count:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the no-op worker exited; see {self.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no-op tasks: {self._count()} of {count} ran; see {self.log}")
            time.sleep(poll)

    def rate(self, n: int) -> dict[str, Any]:
        self.redis.delete(noop_app.COUNT, noop_app.LAST)
        t0 = time.time()
        self._send(n)
        self._wait(n, poll=0.2)
        last = self.redis.get(noop_app.LAST)  # when the last task ran, as the no-op app wrote it
        assert last is not None
        return {"tasks": n, "tasks_per_sec": n / (float(last) - t0)}

    def latency(self, n: int) -> dict[str, float]:
        self.redis.delete(noop_app.COUNT, noop_app.LATENCY)
        for i in range(n):
            self._send(1, stamped=True)
            self._wait(i + 1)
            time.sleep(PAUSE_SECONDS)
        values = [float(v) for v in self.redis.lrange(noop_app.LATENCY, 0, -1)]
        return {k: v * 1000 for k, v in quantiles(values).items()}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def run(jobs: int = 500, latency_jobs: int = 50, root: Path | None = None) -> dict[str, Any]:
    from mxq.workers.jobs.submit import submit

    with running_stack(cpu_devices=1, root=root, prefix="dispatch-") as s:
        wait_job(s, submit(s, "probe", dict(PROBE), "cpu:0"))  # warm-up: MXNet's first job
        cores = worker_cores(s, "cpu:0")
        mxq = mxq_rate(s, jobs)
        print(f"  mxq probe jobs      {mxq['jobs_per_sec']:8,.1f} jobs/s   ({jobs} jobs, submit_many "
              f"{mxq['submit_seconds']:.2f}s, each job p50 {mxq['job_ms_p50']:.1f} ms of work)",
              flush=True)
        latency = mxq_latency(s, latency_jobs)
        bare = BareCelery(s, cores)
        try:
            base = bare.rate(jobs)
            print(f"  bare Celery no-ops  {base['tasks_per_sec']:8,.1f} tasks/s  ({jobs} tasks)",
                  flush=True)
            bare_latency = bare.latency(latency_jobs)
        finally:
            bare.stop()
    result = {"jobs": jobs, "latency_jobs": latency_jobs, "pause_seconds": PAUSE_SECONDS,
              "probe": PROBE, "cores": cores,
              "mxq": mxq, "bare": base, "ratio": mxq["jobs_per_sec"] / base["tasks_per_sec"],
              "latency_ms": latency, "bare_latency_ms": bare_latency}
    print(f"  ratio {result['ratio']:.3f}")
    print(f"  submit-to-start on an idle worker: mxq p50 {latency['p50']:.1f} ms, p95 "
          f"{latency['p95']:.1f} ms | bare Celery p50 {bare_latency['p50']:.1f} ms, p95 "
          f"{bare_latency['p95']:.1f} ms ({latency_jobs} each)")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--latency-jobs", type=int, default=50)
    args = ap.parse_args()
    run(args.jobs, args.latency_jobs)


if __name__ == "__main__":
    main()
