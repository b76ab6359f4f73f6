"""The fleet benchmark's history: millions of past jobs with their throughput points and events,
generated inside PostgreSQL, and the history queries timed against them.

The rows are made by `generate_series` in a few statements (a year of jobs on 125 nodes of 8 GPUs:
most inference, some training and probes; most succeeded), with the tables' secondary indexes
dropped during the load and built again after, as a bulk load would do. The database is kept
between runs (`bench_history` records what it holds): a later run of the same size only removes
the live jobs an earlier run added on top.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from mxq.api.routes import TOTAL_COUNTED
from mxq.db.engine import get_engine
from mxq.db.migrate import upgrade
from mxq.db.reports.history import JobFilter, count_jobs, get_job, list_jobs
from mxq.db.schema import utcnow

NODES, PER_NODE = 125, 8
TABLES = ("jobs", "job_metrics", "job_events")

_JOBS = """
INSERT INTO jobs (id, kind, status, params, requested_device, queue, node, device, worker,
                  submitted_at, started_at, finished_at, progress, progress_at, samples, seconds,
                  samples_per_sec, result, error, attempts)
SELECT i, k.kind, s.status,
       CAST(CASE k.kind
            WHEN 'train' THEN '{"arch": "lenet", "dataset": "digits", "name": "m' || (i % 20) || '"}'
            ELSE '{"model": "m' || (i % 20) || '", "input": "/data/part-' || i || '.npy"}'
            END AS json),
       'auto', 'pool.gpu', 'sim' || lpad((i % :nodes)::text, 3, '0'), 'gpu:' || (i / :nodes % 8),
       'gpu' || (i / :nodes % 8) || '@sim' || lpad((i % :nodes)::text, 3, '0'),
       at, at + interval '2 seconds', at + interval '40 seconds', 1.0, at + interval '40 seconds',
       38000, 38.0, 1000.0, CAST('{}' AS json),
       CASE s.status WHEN 'failed' THEN 'ValueError: simulated failure ' || (i % 50) ELSE NULL END, 1
FROM (SELECT i, i % 100 AS r,
             CAST(:now AS timestamptz) - (CAST(:span AS bigint) * (:n - i) / :n) * interval '1 second' AS at
      FROM generate_series(CAST(:first AS integer), CAST(:last AS integer)) AS i) g
CROSS JOIN LATERAL (SELECT CASE WHEN r < 80 THEN 'infer' WHEN r < 90 THEN 'train' ELSE 'probe' END AS kind) k
CROSS JOIN LATERAL (SELECT CASE WHEN (i * 7) % 100 < 85 THEN 'succeeded'
                                WHEN (i * 7) % 100 < 95 THEN 'failed' ELSE 'cancelled' END AS status) s
"""
_METRICS = """
INSERT INTO job_metrics (job_id, step, at, device, samples, seconds, samples_per_sec)
SELECT j.id, st, j.started_at + st * interval '19 seconds', j.device, 19000, 19.0, 1000.0
FROM jobs j CROSS JOIN generate_series(0, 1) AS st WHERE j.id BETWEEN :first AND :last
"""
_EVENTS = """
INSERT INTO job_events (job_id, at, kind, message, data)
SELECT id, started_at, 'requeued', 'requeued to pool.gpu: worker died while running it',
       CAST('{}' AS json)
FROM jobs WHERE id BETWEEN :first AND :last AND id % 20 = 0
"""
BATCH = 1_000_000


def database_url(server: str, rows: int) -> str:
    """The history database of that size on `server` (one per size, kept between runs)."""
    return make_url(server).set(database=f"mxq_bench_history_{rows}").render_as_string(False)


def _create_database(url: str) -> bool:
    """Create the database if it is missing; True when it was created."""
    parsed = make_url(url)
    admin = get_engine(parsed.set(database="postgres").render_as_string(False))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": parsed.database}):
            return False
        conn.execute(text(f'CREATE DATABASE "{parsed.database}"'))
    return True


def _held(url: str) -> int | None:
    with get_engine(url).connect() as conn:
        if not conn.scalar(text("SELECT to_regclass('bench_history') IS NOT NULL")):
            return None
        return conn.scalar(text("SELECT rows FROM bench_history"))


def prepare(server: str, rows: int, say: Callable[[str], None] = print) -> tuple[str, int]:
    """The URL of a migrated database holding `rows` past jobs and nothing else (live jobs of an
    earlier run removed); returns (url, rows)."""
    url = database_url(server, rows)
    _create_database(url)
    upgrade(url)
    if _held(url) != rows:
        _generate(url, rows, say)
    reset_live(url, rows)
    return url, rows


def _generate(url: str, rows: int, say: Callable[[str], None]) -> None:
    started = time.perf_counter()
    engine = get_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS bench_history"))
        for table in reversed(TABLES):  # (table names are the constants above)
            conn.execute(text(f"DELETE FROM {table}"))  # noqa: S608
        conn.execute(text("DELETE FROM workers"))
        indexes = [(name, ddl) for name, ddl in conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(:t) "
            "AND indexname NOT IN (SELECT conname FROM pg_constraint)"), {"t": list(TABLES)})]
        for name, _ in indexes:
            conn.execute(text(f'DROP INDEX "{name}"'))
    span = 365 * 24 * 3600
    for first in range(1, rows + 1, BATCH):
        last = min(first + BATCH - 1, rows)
        with engine.begin() as conn:
            values = {"first": first, "last": last, "n": rows, "nodes": NODES, "span": span,
                      "now": utcnow() - timedelta(hours=1)}
            conn.execute(text(_JOBS), values)
            conn.execute(text(_METRICS), {"first": first, "last": last})
            conn.execute(text(_EVENTS), {"first": first, "last": last})
        say(f"  history: {last:,} of {rows:,} jobs ({time.perf_counter() - started:.0f} s)")
    with engine.begin() as conn:
        for name, ddl in indexes:
            say(f"  history: index {name}")
            conn.execute(text(ddl))
        for table in ("jobs", "job_events"):  # the next live row's id follows the history's
            conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "  # noqa: S608
                              f"(SELECT coalesce(max(id), 1) FROM {table}))"))
        conn.execute(text("CREATE TABLE bench_history (rows bigint NOT NULL)"))
        conn.execute(text("INSERT INTO bench_history VALUES (:r)"), {"r": rows})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TABLES:
            conn.execute(text(f"VACUUM ANALYZE {table}"))
    say(f"  history: {rows:,} jobs generated in {time.perf_counter() - started:.0f} s")


def reset_live(url: str, rows: int) -> None:
    """Remove what an earlier fleet run added on top of the history."""
    with get_engine(url).begin() as conn:
        conn.execute(text("DELETE FROM job_events WHERE job_id > :r"), {"r": rows})
        conn.execute(text("DELETE FROM job_logs WHERE job_id > :r"), {"r": rows})
        conn.execute(text("DELETE FROM job_metrics WHERE job_id > :r"), {"r": rows})
        conn.execute(text("DELETE FROM epochs WHERE job_id > :r"), {"r": rows})
        conn.execute(text("DELETE FROM jobs WHERE id > :r"), {"r": rows})
        conn.execute(text("DELETE FROM workers"))


def queries(url: str, rows: int) -> dict[str, Callable[[], Any]]:
    """The history questions users ask, as the CLI (`mxq jobs`, `mxq job N`) and the API's job
    list (which adds the total) ask them."""
    rng = random.Random(1)
    since = utcnow() - timedelta(days=7)
    counted = 50 + TOTAL_COUNTED  # as GET /api/v1/jobs counts for its first page
    return {
        "jobs": lambda: list_jobs(url, JobFilter()),
        "jobs --status failed": lambda: list_jobs(url, JobFilter(status="failed")),
        "jobs --node --device": lambda: list_jobs(url, JobFilter(
            node=f"sim{rng.randrange(NODES):03d}", device=f"gpu:{rng.randrange(PER_NODE)}")),
        "jobs --kind train --since 7d": lambda: list_jobs(url, JobFilter(kind="train", since=since)),
        "job N (with metrics, events)": lambda: get_job(url, rng.randrange(1, rows + 1), True, 400),
        "API total, status failed": lambda: count_jobs(url, JobFilter(status="failed"), counted),
        "API total, kind train": lambda: count_jobs(url, JobFilter(kind="train"), counted),
    }


def time_queries(url: str, rows: int, rounds: int) -> dict[str, dict[str, float]]:
    """p50 and p95 (ms) of each history query, the queries interleaved `rounds` times."""
    asked = queries(url, rows)
    times: dict[str, list[float]] = {name: [] for name in asked}
    for _ in range(rounds):
        for name, ask in asked.items():
            t = time.perf_counter()
            ask()
            times[name].append((time.perf_counter() - t) * 1000)
    return {name: {"p50_ms": statistics.median(ts), "p95_ms": percentile(ts, 95)}
            for name, ts in times.items()}


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]
