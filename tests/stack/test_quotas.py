"""Quotas and fair shares through real workers: a user's jobs beyond its quota wait, held in
SQL, saying why, and are admitted one by one as its devices free, never holding more devices
than allowed, however many devices are idle."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime

import numpy as np
import pytest

from mxq.db.sharing import users
from mxq.json_types import JsonObject
from mxq.shares import Share
from mxq.users import Role
from mxq.workers.jobs.submit import BeyondQuota, submit
from tests.conftest import Stack, wait_until
from tests.support.inference import committed_position, save_npy

USER = "quota-carol"
_runs = itertools.count(1)
# Each of the two one-sample-a-batch jobs lasts about 9 s here: with 30,000 samples (2.2-2.4 s since
# reads hold many batches) one CI run saw the borrowed job yield 0.5 s before its end.
BORROW_SAMPLES = 120_000


@pytest.fixture(scope="module")
def lenet(workers: Stack) -> str:
    """A LeNet: a job of 30,000 samples lasts seconds on a CPU device, long enough to watch."""
    proc = workers.mxq("models", "add", "lenet-quota", "--arch", "lenet", "--input-shape", "1,28,28",
                       "--classes", "10")
    assert proc.returncode == 0, proc.stderr
    save_npy(workers, "quota.npy", np.random.default_rng(9).standard_normal((30_000, 1, 28, 28))
             .astype(np.float32))
    return "lenet-quota"


@pytest.fixture
def capped(workers: Stack) -> Iterator[str]:
    """A user allowed one device at once; removed after (then no job of the stack is held)."""
    name = f"{USER}-{next(_runs)}"  # a removed user's name is retired: a new one each time
    users.add(workers.settings.database, name, Role.SUBMIT, Share(1.0, max_devices=1))
    yield name
    users.remove(workers.settings.database, name)


def _span(stack: Stack, job_id: int) -> tuple[datetime, datetime]:
    job = stack.wait(job_id, timeout=180)
    assert job["status"] == "succeeded", job["error"]
    assert job["started_at"] is not None and job["finished_at"] is not None
    return datetime.fromisoformat(job["started_at"]), datetime.fromisoformat(job["finished_at"])


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_jobs_beyond_a_quota_wait_saying_why_and_never_run_at_once(workers: Stack, lenet: str,
                                                                    capped: str) -> None:
    params: JsonObject = {"model": lenet, "input": "quota.npy", "batch_size": 128}
    ids = [submit(workers.settings, "infer", dict(params), "auto", owner=capped) for _ in range(3)]
    wait_until(lambda: workers.job(ids[0])["status"], 60, "the first job to run",
               until=lambda s: s == "running", interval=0.05)
    view = [e for e in workers.mxq_json("queue", "--limit", "1000") if e["id"] in ids]
    assert view and all(e["held"] and e["why"] == "waiting: quota 1 device, 1 in use" for e in view)
    shown = workers.mxq_json("job", str(ids[2]))  # the last one, still held (two run before it)
    assert shown["status"] == "queued"
    assert shown["waiting"].startswith("waiting: quota 1 device, 1 in use"), shown["waiting"]
    spans = sorted(_span(workers, job_id) for job_id in ids)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start  # one at a time, although a second device was idle
    other = submit(workers.settings, "probe", {"size": 16, "batch": 1, "repeat": 1}, "auto")
    assert workers.wait(other)["status"] == "succeeded"  # a user without a quota is not held back


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_an_idle_device_is_lent_beyond_a_quota_and_taken_back_first(workers: Stack, mlp: dict,
                                                                    lenet: str, capped: str) -> None:
    s = workers.settings.model_copy(update={"quota_borrowing": True})  # MXQ_QUOTA_BORROWING=1
    # One sample a batch: both jobs last seconds (several one-second flushes) even on a fast CPU,
    # so the borrowed one is still running when the taker arrives.
    save_npy(workers, "borrow.npy", np.random.default_rng(10).standard_normal(
        (BORROW_SAMPLES, 1, 28, 28), dtype=np.float32))
    params: JsonObject = {"model": lenet, "input": "borrow.npy", "batch_size": 1}
    mine, lent = (submit(s, "infer", dict(params), "auto", owner=capped) for _ in range(2))
    wait_until(lambda: [committed_position(workers, i) > 0 for i in (mine, lent)], 60,
               "both to store a flush", until=lambda stored: all(stored), interval=0.05)
    assert (workers.job(mine)["borrowed"], workers.job(lent)["borrowed"]) == (False, True)
    assert workers.job(lent)["preemptible"] is True  # borrowed use is preemptible
    save_npy(workers, "taker.npy", np.zeros((1_000, 64), np.float32))
    taker = submit(s, "infer", {"model": "mlp64", "input": "taker.npy"}, "auto")  # no quota: its own
    assert workers.wait(taker)["status"] == "succeeded"
    done = {i: workers.wait(i, timeout=180) for i in (mine, lent)}
    assert all(j["status"] == "succeeded" for j in done.values())
    assert (done[mine]["preemptions"], done[lent]["preemptions"]) == (0, 1)  # the borrowed one yielded


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_a_chunked_job_runs_its_chunks_one_at_a_time_under_a_quota_of_one(workers: Stack,
                                                                          lenet: str,
                                                                          capped: str) -> None:
    """Its chunks are held and admitted like any job of its owner (two ran at once, on the two
    devices, under a quota of one)."""
    params: JsonObject = {"model": lenet, "input": "quota.npy", "batch_size": 128, "chunk_size": 10_000}
    parent = submit(workers.settings, "infer", params, "auto", owner=capped)
    assert workers.wait(parent, timeout=300)["status"] == "succeeded"
    chunks = [j["id"] for j in workers.mxq_json("jobs", "--limit", "1000")
              if j.get("parent_id") == parent]
    assert len(chunks) == 3, chunks
    spans = sorted(_span(workers, job_id) for job_id in chunks)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start  # one at a time, although a second device was idle


def test_a_job_its_quota_can_never_admit_is_refused_at_submit(workers: Stack, capped: str) -> None:
    """A 2-device training of a 1-device user: refused now, not held for ever."""
    with pytest.raises(BeyondQuota, match="needs 2 devices at once and its owner's quota is 1"):
        submit(workers.settings, "train", {"arch": "mlp", "dataset": "digits", "name": "beyond",
                                           "devices": 2}, "auto", owner=capped)
