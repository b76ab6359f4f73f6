"""History queries at scale: 100,000 jobs with their throughput points, on SQLite and
PostgreSQL; p50/p95 of the filtered list (`mxq jobs`, `GET /api/v1/jobs`) and of one job's detail.

    python -m bench.history_query [--jobs 100000] [--postgres postgresql://127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import insert

from mxq.db.engine import get_engine
from mxq.db.migrate import upgrade
from mxq.db.reports.history import JobFilter, count_jobs, get_job, list_jobs
from mxq.db.schema import Job, JobMetric, utcnow

STATUSES = ["succeeded"] * 8 + ["failed", "cancelled"]
KINDS = ["infer", "infer", "probe", "train"]
DEVICES = [f"cpu:{i}" for i in range(4)] + [f"gpu:{i}" for i in range(4)]
POINTS = 3  # throughput points per job


def fill(url: str, n: int) -> None:
    """n jobs spread over 90 days, in batches of 10,000 rows."""
    rng, now = random.Random(0), utcnow()
    engine = get_engine(url)
    for start in range(0, n, 10_000):
        jobs, points = [], []
        for i in range(start + 1, min(start + 10_000, n) + 1):
            at = now - timedelta(minutes=rng.randrange(90 * 24 * 60))
            device = rng.choice(DEVICES)
            jobs.append({"id": i, "kind": rng.choice(KINDS), "status": rng.choice(STATUSES),
                         "params": {"model": f"m{rng.randrange(20)}"}, "requested_device": "auto",
                         "queue": "pool.cpu", "node": f"box{rng.randrange(3)}", "device": device,
                         "worker": f"{device.replace(':', '')}@box", "submitted_at": at,
                         "started_at": at, "finished_at": at + timedelta(seconds=30), "progress": 1.0,
                         "samples": 10_000, "seconds": 30.0, "samples_per_sec": 333.3, "attempts": 1})
            points += [{"job_id": i, "step": k, "at": at + timedelta(seconds=10 * k), "device": device,
                        "samples": 3333, "seconds": 10.0, "samples_per_sec": 333.3} for k in range(POINTS)]
        with engine.begin() as conn:
            conn.execute(insert(Job), jobs)
            conn.execute(insert(JobMetric), points)


def timed(fn: Callable[[], object], runs: int = 200) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    q = statistics.quantiles(times, n=20)
    return statistics.median(times), q[18]


def measure(name: str, url: str, n: int) -> None:
    upgrade(url)
    t = time.perf_counter()
    fill(url, n)
    print(f"{name}: {n:,} jobs + {n * POINTS:,} points written in {time.perf_counter() - t:.1f}s")
    rng = random.Random(1)
    since = utcnow() - timedelta(days=7)

    def history() -> None:
        f = JobFilter(status=rng.choice(STATUSES), kind=rng.choice(KINDS), device=rng.choice(DEVICES),
                      since=since, limit=50)
        list_jobs(url, f)
        count_jobs(url, f)

    for label, fn in [("filtered list + total", history),
                      ("unfiltered newest 50", lambda: list_jobs(url, JobFilter(limit=50))),
                      ("one job with metrics", lambda: get_job(url, rng.randrange(1, n), True))]:
        p50, p95 = timed(fn)
        print(f"  {label:24s} p50 {p50:7.2f} ms   p95 {p95:7.2f} ms   (aim: p95 under 50 ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test",
                    help="a server where a scratch database can be created ('' to skip)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measure("SQLite", f"sqlite:///{tmp}/bench.db", args.jobs)
    if args.postgres:
        import psycopg

        name = f"mxq_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = args.postgres.rsplit("/", 1)[0] + f"/{name}"
        try:
            measure("PostgreSQL", url, args.jobs)
        finally:
            get_engine(url).dispose()
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
