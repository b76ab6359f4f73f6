"""Outages of the servers while jobs are queued and running: the broker restarts, the database
goes away for a few seconds, the broker's queues are emptied. Every job finishes, once."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import pytest
from sqlalchemy.engine import make_url

from mxq.db import events, jobs
from mxq.workers.broker.messages import stored_names
from mxq.workers.broker.redis_client import client
from mxq.workers.jobs.submit import submit
from tests.conftest import SYSTEM_PG, wait_until
from tests.faults.stacks import FaultStack, report

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

pytestmark = [pytest.mark.slow, pytest.mark.both_legs]

PROBE = {"size": 16, "batch": 1, "repeat": 1}
HOLD = {"size": 512, "batch": 8, "repeat": 10_000}  # minutes of work: runs until cancelled
SMALL_INPUT = 2_000


@pytest.fixture(scope="module")
def model(faulty: FaultStack) -> FaultStack:
    faulty.model()
    faulty.samples("small.npy", SMALL_INPUT, seed=1)
    faulty.samples("medium.npy", 100_000, seed=2)
    return faulty


def _mixed(stack: FaultStack, count: int) -> tuple[list[int], list[int]]:
    """`count` jobs, half probes and half small inferences, routed to the pool."""
    probes = [submit(stack.settings, "probe", dict(PROBE), "auto") for _ in range(count // 2)]
    infers = [stack.infer("mlp64", "small.npy") for _ in range(count - count // 2)]
    return probes, infers


def _wait_finished(stack: FaultStack, ids: list[int], at_least: int) -> None:
    wait_until(lambda: Counter(stack.statuses(ids).values()), 300,
               f"{at_least} of {len(ids)} jobs to succeed or fail",
               until=lambda counts: counts["succeeded"] + counts["failed"] >= at_least, interval=0.05)


@contextmanager
def _held(stack: FaultStack) -> Iterator[list[int]]:
    """Both devices busy with a probe that runs until cancelled on the way out, so what is
    submitted meanwhile is still queued (or prefetched) when the fault strikes."""
    ids = [submit(stack.settings, "probe", dict(HOLD), f"cpu:{i}") for i in range(2)]
    for job_id in ids:
        stack.wait(job_id, until=("running",))
    try:
        yield ids
    finally:
        for job_id in ids:
            jobs.cancel(stack.settings.database, job_id)


def _check_held(stack: FaultStack, held: list[int]) -> None:
    """The holding probes ran through the fault in their first attempt and stopped when asked."""
    for job_id, job in stack.wait_all(held, timeout=120).items():
        assert (job["status"], job["attempts"]) == ("cancelled", 1), (job_id, job["error"])


def _rows(stack: FaultStack, ids: list[int], samples: int) -> tuple[int, int]:
    """Prediction rows missing and duplicated over `ids` (each must hold 0..samples-1)."""
    missing = duplicated = 0
    for job_id in ids:
        index, _ = stack.predicted(job_id)
        missing += samples - len(np.unique(index))
        duplicated += len(index) - len(np.unique(index))
    return missing, duplicated


def _check_once(stack: FaultStack, done: dict[int, JobRecord]) -> None:
    for job_id, job in done.items():
        assert job["status"] == "succeeded", (job_id, job["error"])
        assert job["attempts"] == 1, (job_id, job["attempts"], events.list_events(
            stack.settings.database, job_id))


def _republished(stack: FaultStack, ids: list[int]) -> int:
    return sum(any(e["kind"] == events.REPUBLISHED for e in events.list_events(
        stack.settings.database, i)) for i in ids)


def test_broker_restart_with_100_jobs_queued_or_running(model: FaultStack) -> None:
    with _held(model) as held:
        probes, infers = _mixed(model, 100)
        model.restart_broker(down_seconds=2.0)
    ids = probes + infers
    done = model.wait_all(ids, timeout=600)
    _check_held(model, held)
    _check_once(model, done)
    missing, duplicated = _rows(model, infers, SMALL_INPUT)
    assert missing == duplicated == 0
    if model.name == "system":  # nothing on disk: every queued message was lost, and republished
        assert _republished(model, ids) > 0
    report("broker restart", {"backend": model.name, "trials": 1, "jobs": len(ids),
                              "finished": len(done), "rows_lost": missing,
                              "rows_duplicated": duplicated,
                              "republished": _republished(model, ids)})


def test_emptied_queues_are_refilled_by_the_reconciler(model: FaultStack) -> None:
    with _held(model) as held:
        probes, infers = _mixed(model, 60)
        r = client(model.settings.broker)
        dropped = r.delete(*stored_names(["pool.cpu", *(f"testnode.cpu.{i}" for i in range(2))]))
    assert dropped  # there was something queued to lose
    ids = probes + infers
    done = model.wait_all(ids, timeout=600)
    _check_held(model, held)
    _check_once(model, done)
    missing, duplicated = _rows(model, infers, SMALL_INPUT)
    assert missing == duplicated == 0
    republished = _republished(model, ids)
    assert republished > 0
    report("queues emptied", {"backend": model.name, "trials": 1, "jobs": len(ids),
                              "finished": len(done), "rows_lost": missing,
                              "rows_duplicated": duplicated, "republished": republished})


def _block_postgres(url: str, seconds: float) -> None:
    """Refuse new connections to the job database and cut the open ones, for `seconds`."""
    import psycopg

    name = make_url(url).database
    with psycopg.connect(SYSTEM_PG, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        time.sleep(seconds)
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def _block_sqlite(url: str, seconds: float) -> None:
    """Hold SQLite's write lock for `seconds`: every writer waits."""
    conn = sqlite3.connect(str(make_url(url).database), timeout=30)
    conn.execute("BEGIN EXCLUSIVE")
    time.sleep(seconds)
    conn.rollback()
    conn.close()


def test_database_outage_while_jobs_run(model: FaultStack) -> None:
    ids = [model.infer("mlp64", "medium.npy") for _ in range(12)]
    _wait_finished(model, ids, 2)
    block = _block_sqlite if model.name == "embedded" else _block_postgres
    block(model.settings.database, 5.0)
    done = model.wait_all(ids, timeout=600)
    for job_id, job in done.items():
        assert job["status"] == "succeeded", (job_id, job["error"])
    missing, duplicated = _rows(model, ids, 100_000)
    assert missing == duplicated == 0
    logs = "".join(p.read_text(errors="replace") for p in (model.home / "logs").glob("cpu*.log"))
    if model.name == "system":  # connections were cut: the workers must have retried
        assert "; retry 1 in" in logs
    report("database outage (5 s)", {
        "backend": model.name, "trials": 1, "jobs": len(ids), "finished": len(done),
        "rows_lost": missing, "rows_duplicated": duplicated,
        "reruns": sum(j["attempts"] - 1 for j in done.values()),
        "retries_logged": logs.count("; retry ")})
