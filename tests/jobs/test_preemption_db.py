"""Preemption in SQL, on SQLite and PostgreSQL: a request marks the running job, its attempt
hears it from the writes it makes anyway, yields only while the asking job still waits, and goes
back to the queue without using an attempt."""

from __future__ import annotations

import pytest

from mxq.db import jobs
from mxq.db.engine import session_scope
from mxq.db.fence import Fence
from mxq.db.jobs import Placement
from mxq.db.outputs import predictions
from mxq.db.reports.history import require_job
from mxq.db.schema import Job
from mxq.db.sharing import preemption
from mxq.priorities import Priority
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs

A = Placement(worker="cpu0@preempting", node="n", device="cpu:0")  # no other test's worker
TTL = 5.0


def _job(stack: Stack, level: str) -> int:
    return jobs.create_job(stack.settings.database, "infer", {}, "auto", "pool.cpu",
                           priority=Priority.of(level))


def _row(stack: Stack, job_id: int) -> Job:
    with session_scope(stack.settings.database) as s:
        return s.get_one(Job, job_id)


def test_an_asked_attempt_hears_it_yields_and_is_claimed_again_without_using_an_attempt(
        stack: Stack) -> None:
    url = stack.settings.database
    low, high = _job(stack, "low"), _job(stack, "high")
    fence = jobs.take(url, low, A, 1, TTL)  # one attempt allowed: a preemption must not use it
    assert isinstance(fence, Fence)
    [seen] = [r for r in preemption.running(url, TTL) if r.id == low]  # (the stack is shared)
    assert seen.preemptible and seen.level == "low" and seen.devices == {"n/cpu:0"}
    assert high in [w.id for w in preemption.waiting(url, 1000)]
    assert preemption.ask_to_yield(url, low, high)
    assert not preemption.ask_to_yield(url, low, high)  # once: it already yields
    assert jobs.set_progress(url, low, 0.5, fence) is jobs.RunCheck.PREEMPT
    assert predictions.commit(url, fence, [(low, 0, 1, 0.5, None)], 1) is jobs.RunCheck.PREEMPT
    assert preemption.yield_target(url, fence) == high
    assert preemption.yielded(url, fence, high)
    row = _row(stack, low)
    assert (row.status, row.preemptions, row.preempted_by, row.preempt_for, row.committed) == (
        "queued", 1, [high], None, 1)
    again = jobs.take(url, low, A, 1, TTL)
    assert isinstance(again, Fence) and again.attempt == 2  # a new fence, the attempt not counted
    assert jobs.run_check(url, again) is jobs.RunCheck.GO_ON


def _yield_once(url: str, low: int, high: int) -> None:
    fence = jobs.take(url, low, A, 1, TTL)
    assert isinstance(fence, Fence)
    assert preemption.ask_to_yield(url, low, high) and preemption.yielded(url, fence, high)


def test_a_yield_and_its_resumption_are_one_attempt_in_the_record(stack: Stack) -> None:
    url = stack.settings.database
    low, high, cancelled = _job(stack, "low"), _job(stack, "high"), _job(stack, "low")
    _yield_once(url, low, high)
    assert (require_job(url, low)["attempts"], require_job(url, low)["preemptions"]) == (1, 1)
    assert isinstance(jobs.take(url, low, A, 1, TTL), Fence)  # resumed: the same attempt
    assert (require_job(url, low)["attempts"], require_job(url, low)["preemptions"]) == (1, 1)
    _yield_once(url, cancelled, high)
    jobs.cancel(url, cancelled)  # while it waited to resume
    assert require_job(url, cancelled)["attempts"] == 1


def test_a_job_that_dies_after_a_resumption_gave_up_after_its_attempts_less_its_yields(
        stack: Stack) -> None:
    url = stack.settings.database
    low, high = _job(stack, "low"), _job(stack, "high")
    _yield_once(url, low, high)
    assert isinstance(jobs.take(url, low, A, 1, TTL), Fence)
    assert jobs.clear_heartbeat(url, low)  # its worker died
    assert jobs.take(url, low, A, 1, TTL) is jobs.Claim.EXHAUSTED
    assert (require_job(url, low)["error"] or "").startswith("gave up after 1 attempts (limit 1)")


def test_a_request_whose_job_no_longer_waits_is_dropped(stack: Stack) -> None:
    url = stack.settings.database
    low, high = _job(stack, "low"), _job(stack, "high")
    fence = jobs.take(url, low, A, 3, TTL)
    assert isinstance(fence, Fence)
    assert preemption.ask_to_yield(url, low, high)
    assert jobs.cancel(url, high) is not None  # the waiting job went away
    assert preemption.yield_target(url, fence) is None
    assert jobs.run_check(url, fence) is jobs.RunCheck.GO_ON and _row(stack, low).preempt_for is None


def test_a_cancel_comes_before_a_preemption(stack: Stack) -> None:
    url = stack.settings.database
    low, high = _job(stack, "low"), _job(stack, "high")
    fence = jobs.take(url, low, A, 3, TTL)
    assert isinstance(fence, Fence)
    preemption.ask_to_yield(url, low, high)
    jobs.cancel(url, low)
    assert jobs.run_check(url, fence) is jobs.RunCheck.CANCEL
