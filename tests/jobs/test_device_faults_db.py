"""A device fault in SQL, on SQLite and PostgreSQL: the attempt goes back to the queue without
using an attempt, keeping what it committed; the job's `MAX_DEVICE_FAULTS`th is left to fail."""

from __future__ import annotations

import pytest

from mxq.db import jobs
from mxq.db.batches import claim_many, hand_back
from mxq.db.fence import Fence
from mxq.db.jobs import Placement
from mxq.db.outputs import predictions
from mxq.db.reports.history import require_job
from mxq.priorities import Priority
from mxq.tasks.runner import MAX_DEVICE_FAULTS
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs

A = Placement(worker="gpu0@faulting", node="n", device="gpu:0")  # no other test's worker
TTL = 5.0


def test_a_device_fault_requeues_without_an_attempt_until_the_last_one(stack: Stack) -> None:
    url = stack.settings.database
    job = jobs.create_job(url, "infer", {}, "auto", "pool.gpu")
    fence = jobs.take(url, job, A, 1, TTL)  # one attempt allowed: a device fault must not use it
    assert isinstance(fence, Fence)
    predictions.commit(url, fence, [(job, 0, 1, 0.5, None)], 1)
    assert jobs.device_faulted(url, fence, MAX_DEVICE_FAULTS) is True
    record = require_job(url, job)
    assert (record["status"], record["device_faults"], record["attempts"]) == ("queued", 1, 1)
    assert jobs.device_faulted(url, fence, MAX_DEVICE_FAULTS) is None  # no longer that attempt's
    again = jobs.take(url, job, A, 1, TTL)
    assert isinstance(again, Fence) and again.attempt == 2  # claimed: the fault used no attempt
    assert require_job(url, job)["attempts"] == 1
    assert jobs.device_faulted(url, again, MAX_DEVICE_FAULTS) is False  # the second: the job's own
    assert require_job(url, job)["status"] == "running"  # left for the job frame to fail


def test_a_dead_workers_job_after_a_device_fault_is_requeued_as_the_limit_counts(
        stack: Stack) -> None:
    """The requeue of a job whose worker died counts its attempts as the claim does (less its
    yields and device faults): it failed one attempt early after a device fault."""
    from datetime import timedelta

    from mxq.db.schema import utcnow
    from mxq.workers.broker.publish import requeue

    s = stack.settings.model_copy(update={"max_attempts": 2})
    job = jobs.create_job(s.database, "infer", {}, "auto", "pool.gpu")
    fence = jobs.take(s.database, job, A, s.max_attempts, TTL)
    assert isinstance(fence, Fence) and jobs.device_faulted(s.database, fence, MAX_DEVICE_FAULTS)
    assert isinstance(jobs.take(s.database, job, A, s.max_attempts, TTL), Fence)  # its worker dies
    assert requeue(s, job, "infer", "pool.gpu", "its worker died", utcnow() + timedelta(seconds=1))
    record = require_job(s.database, job)  # published again, free for the next claim
    assert (record["status"], record["error"], record["attempts"]) == ("running", None, 1)
    assert isinstance(jobs.take(s.database, job, A, s.max_attempts, TTL), Fence)


def test_a_merged_batchs_members_go_back_without_an_attempt(stack: Stack) -> None:
    url = stack.settings.database
    members = [jobs.create_job(url, "infer", {}, "cpu:0", f"q.{i}",
                               priority=Priority.of("high" if i else "normal", False))
               for i in range(3)]
    assert claim_many(url, members, A) == members
    assert hand_back(url, members[1:], "another-worker") == []  # not that worker's
    assert hand_back(url, members[1:], A.worker) == [(members[1], "q.1", "high"),
                                                           (members[2], "q.2", "high")]
    for job_id in members[1:]:
        record = require_job(url, job_id)
        assert (record["status"], record["device_faults"], record["attempts"]) == ("queued", 1, 1)
    assert isinstance(jobs.take(url, members[1], A, 1, TTL), Fence)  # one attempt allowed: unused
    assert require_job(url, members[0])["status"] == "running"  # the lead: its frame's to send back
