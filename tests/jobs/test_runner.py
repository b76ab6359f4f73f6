"""The frame every job runs in, called directly (no Celery worker, no sleep): what each kind of
body outcome records and what the delivery returns (`Delivery`, or the `Claim` that kept it
from running)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from mxq.db import jobs
from mxq.db.engine import session_scope
from mxq.db.jobs import Claim, Placement
from mxq.db.schema import Job
from mxq.errors import DeviceFault
from mxq.tasks.runner import Delivery, FanOut, JobContext, JobInputError, Outcome, Worker, run_job
from mxq.workers.broker.messages import in_broker
from mxq.workers.broker.queues import device_queue
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs

NODE = "runnernode"
AT = Placement(worker=f"cpu0@{NODE}", node=NODE, device="cpu:0")
OWN = device_queue(NODE, "cpu", 0)


def _worker(stack: Stack) -> Worker:
    return Worker(AT, stack.settings, heartbeat=None)


def _job(stack: Stack, queue: str = OWN) -> int:
    return jobs.create_job(stack.settings.database, "probe", {"size": 4}, "cpu:0", queue)


def test_an_outcome_succeeds_once(isolated: Stack) -> None:
    w, job_id = _worker(isolated), _job(isolated)
    seen: list[JobContext] = []

    def body(job: JobContext) -> Outcome:
        seen.append(job)
        return Outcome(samples=10, seconds=2.0, result={"x": 1})

    assert run_job(job_id, body, worker=w) is Delivery.SUCCEEDED
    record = isolated.job(job_id)
    assert (record["status"], record["samples"], record["samples_per_sec"], record["result"]) == \
        ("succeeded", 10, 5.0, {"x": 1})
    assert seen[0].params == {"size": 4} and seen[0].fence is not None and seen[0].fence.attempt == 1
    assert run_job(job_id, body, worker=w) is Claim.FINISHED  # a second delivery runs nothing
    assert len(seen) == 1
    assert run_job(10**9, body, worker=w) is Claim.MISSING


@pytest.mark.parametrize(("error", "recorded"), [
    (JobInputError("input x.npy has NaN in sample 3"), "input x.npy has NaN in sample 3"),
    (KeyError("samples"), "KeyError: 'samples'"),
], ids=["bad input", "unexpected"])
def test_a_failing_body_fails_its_job_and_says_why(isolated: Stack, error: Exception,
                                                     recorded: str) -> None:
    job_id = _job(isolated)

    def body(_job: JobContext) -> Outcome:
        raise error

    assert run_job(job_id, body, worker=_worker(isolated)) is Delivery.FAILED
    record = isolated.job(job_id)
    assert record["status"] == "failed" and record["error"] is not None and recorded in record["error"]


def test_a_device_fault_queues_the_job_again_and_marks_the_worker(isolated: Stack) -> None:
    w, job_id = _worker(isolated), _job(isolated)

    def body(_job: JobContext) -> Outcome:
        raise DeviceFault("CUDA error: an illegal memory access was encountered")

    assert run_job(job_id, body, worker=w) is Delivery.DEVICE_FAULT
    record = isolated.job(job_id)
    assert record["status"] == "queued" and record["error"] is None
    assert w.faults and "illegal memory access" in w.faults[0]  # its worker takes itself out
    assert job_id in in_broker(isolated.settings.broker, {OWN})[0]  # published again


def test_a_delivery_for_another_device_is_sent_to_its_queue(isolated: Stack) -> None:
    elsewhere = device_queue(NODE, "cpu", 1)
    job_id = _job(isolated, elsewhere)
    ran: list[int] = []

    def body(job: JobContext) -> Outcome:
        ran.append(job.id)
        return Outcome(1, 1.0)

    assert run_job(job_id, body, worker=_worker(isolated)) is Delivery.REDIRECTED
    assert not ran and isolated.job(job_id)["status"] == "queued"
    assert job_id in in_broker(isolated.settings.broker, {elsewhere})[0]


def test_a_fan_out_makes_its_chunks_once(isolated: Stack) -> None:
    job_id = _job(isolated)
    split = FanOut([{"size": 4, "start": 0, "stop": 2}, {"size": 4, "start": 2, "stop": 4}])
    assert run_job(job_id, lambda _job: split, worker=_worker(isolated)) is Delivery.SPLIT
    chunks = jobs.chunk_statuses(isolated.settings.database, job_id, but=-1)
    assert sorted(chunks) == ["queued", "queued"]
    assert isolated.job(job_id)["status"] == "running"  # until its chunks end
    # A redelivery of the parent (its heartbeat is cleared once split) makes no chunk twice.
    assert run_job(job_id, lambda _job: split, worker=_worker(isolated)) is Delivery.SPLIT
    assert len(jobs.chunk_statuses(isolated.settings.database, job_id, but=-1)) == 2


def test_a_parent_settles_when_its_last_chunk_ends(isolated: Stack) -> None:
    """The frame's last step after every delivery settles the parent of a chunk: succeeded once
    every chunk did, with the samples of all."""
    w, job_id = _worker(isolated), _job(isolated)
    split = FanOut([{"size": 4, "start": 0, "stop": 2}, {"size": 4, "start": 2, "stop": 4}],
                   queues=[OWN, OWN])
    assert run_job(job_id, lambda _job: split, worker=w) is Delivery.SPLIT
    with session_scope(isolated.settings.database) as session:
        first, second = session.scalars(select(Job.id).where(Job.parent_id == job_id).order_by(Job.id))

    def body(job: JobContext) -> Outcome:
        return Outcome(samples=job.params["stop"] - job.params["start"], seconds=1.0)

    assert run_job(first, body, worker=w) is Delivery.SUCCEEDED
    assert isolated.job(job_id)["status"] == "running"
    assert run_job(second, body, worker=w) is Delivery.SUCCEEDED
    parent = isolated.job(job_id)
    assert (parent["status"], parent["samples"]) == ("succeeded", 4)
