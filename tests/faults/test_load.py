"""Load: 5,000 small probe and inference jobs queued at once over two devices all finish, and the
workers' memory stays flat from the first thousand jobs to the last."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from mxq.workers.jobs.submit import submit_many
from tests.conftest import wait_until
from tests.faults.stacks import FaultStack, report

pytestmark = pytest.mark.slow

JOBS = 5_000
ROUND = 250  # jobs of each kind per submit_many call
WARM = 1_000  # jobs done before the first memory reading (imports and caches are settled)
# Flat: growth over the last 4,000 jobs within this share of the warm size (plus a small slack
# for allocator noise). A leak of even 4 KiB per job would be 16 MiB here.
GROWTH_LIMIT, SLACK_MIB = 0.10, 8


def _rss_mib(pid: int | None) -> float:
    assert pid is not None, "the worker is not live"
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _finished(stack: FaultStack, ids: list[int]) -> int:
    return sum(v in ("succeeded", "failed") for v in stack.statuses(ids).values())


@pytest.mark.timeout(1800)
def test_5000_small_jobs_finish_with_flat_worker_memory(faulty: FaultStack) -> None:
    faulty.model()
    faulty.samples("tiny.npy", 8)
    started, ids = time.monotonic(), []
    for _ in range(JOBS // (2 * ROUND)):  # interleaved, so both kinds run before the first reading
        ids += submit_many(faulty.settings, "probe", [{"size": 16, "batch": 1, "repeat": 1}] * ROUND)
        ids += submit_many(faulty.settings, "infer", [{"model": "mlp64", "input": "tiny.npy"}] * ROUND)
    queued = time.monotonic() - started
    pids = {name: faulty.worker_pid(name) for name in ("cpu0@testnode", "cpu1@testnode")}

    wait_until(lambda: _finished(faulty, ids), 1500, f"{WARM} jobs to finish (the warm-up)",
               until=lambda finished: finished >= WARM, interval=1)
    warm = {n: _rss_mib(p) for n, p in pids.items()}
    done = faulty.wait_all(ids, timeout=1500)
    end = {n: _rss_mib(p) for n, p in pids.items()}
    seconds = time.monotonic() - started

    assert Counter(j["status"] for j in done.values()) == {"succeeded": JOBS}
    assert {n: faulty.worker_pid(n) for n in pids} == pids  # no worker died or restarted
    by_device = Counter(j["device"] for j in done.values())
    assert set(by_device) == {"cpu:0", "cpu:1"}
    for name in pids:
        assert end[name] <= warm[name] * (1 + GROWTH_LIMIT) + SLACK_MIB, (name, warm, end)
    report("load: 5,000 small jobs", {
        "backend": faulty.name, "trials": 1, "jobs": JOBS, "finished": len(done), "rows_lost": 0,
        "rows_duplicated": 0, "queue_seconds": round(queued, 1),
        "jobs_per_sec": round(JOBS / seconds, 1), "by_device": dict(by_device),
        "rss_mib_after_1000": {n: round(v) for n, v in warm.items()},
        "rss_mib_after_5000": {n: round(v) for n, v in end.items()}})
