"""The frame every job runs in, called directly (no Celery worker, no sleep): what each kind of
body outcome records and what the delivery returns (`Delivery`, or the `Claim` that kept it
from running)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from mxq.db import jobs
from mxq.db.chunks import chunk_statuses, fan_out
from mxq.db.engine import session_scope
from mxq.db.fence import Fence
from mxq.db.jobs import Claim, Placement
from mxq.db.schema import Job, as_utc
from mxq.db.sharing import users
from mxq.errors import DeviceFault
from mxq.shares import Share
from mxq.tasks.job_context import FanOut, JobContext, JobInputError, Outcome
from mxq.tasks.middleware.admission import AdmitNext
from mxq.tasks.middleware.current_job import CurrentJob
from mxq.tasks.middleware.middleware import Run
from mxq.tasks.middleware.parent import SettleParent
from mxq.tasks.runner import Delivery, Worker, run_job
from mxq.users import Role
from mxq.workers.broker.messages import in_broker
from mxq.workers.broker.queues import device_queue
from mxq.workers.fleet import suspects
from mxq.workers.fleet.heartbeat import Heartbeat
from mxq.workers.jobs.jobspecs import InferParams, ProbeParams, stored
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs

NODE = "runnernode"
AT = Placement(worker=f"cpu0@{NODE}", node=NODE, device="cpu:0")
OWN = device_queue(NODE, "cpu", 0)


def _worker(stack: Stack) -> Worker:
    return Worker(AT, stack.settings, heartbeat=None)


def _job(stack: Stack, queue: str = OWN, params: dict[str, object] | None = None) -> int:
    return jobs.create_job(stack.settings.database, "probe", params or {"size": 16}, "cpu:0", queue)


def _chunk(start: int, stop: int) -> InferParams:
    return InferParams(model="m", input="x.npy", start=start, stop=stop)


def test_an_outcome_succeeds_once(isolated: Stack) -> None:
    w, job_id = _worker(isolated), _job(isolated)
    seen: list[JobContext] = []

    def body(job: JobContext) -> Outcome:
        seen.append(job)
        assert job.params(ProbeParams).size == 16  # typed, its defaults filled in
        return Outcome(samples=10, seconds=2.0, result={"x": 1})

    assert run_job(job_id, body, worker=w) is Delivery.SUCCEEDED
    record = isolated.job(job_id)
    assert (record["status"], record["samples"], record["samples_per_sec"], record["result"]) == \
        ("succeeded", 10, 5.0, {"x": 1})
    assert seen[0].stored == {"size": 16} and seen[0].fence is not None and seen[0].fence.attempt == 1
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


def test_stored_parameters_that_no_longer_fit_fail_the_job_with_one_line(isolated: Stack) -> None:
    """A body reads its parameters typed, checked again against this worker's limits: a stored
    job they refuse (a limit lowered since its submit, a row written by hand) fails, saying which
    field, which value and what is allowed; the worker goes on."""
    job_id = _job(isolated, params={"size": 16, "repeat": 0})

    def body(job: JobContext) -> Outcome:
        job.params(ProbeParams)
        raise AssertionError("unreachable: the parameters are refused")

    assert run_job(job_id, body, worker=_worker(isolated)) is Delivery.FAILED
    assert isolated.job(job_id)["error"] == ("invalid probe parameters: repeat=0: Input should be "
                                             "greater than or equal to 1")


CUDA_FAULT = "CUDA error: an uncorrectable ECC error was encountered"


def test_a_device_fault_queues_the_job_again_and_marks_the_worker(isolated: Stack) -> None:
    w, job_id = _worker(isolated), _job(isolated)

    def body(_job: JobContext) -> Outcome:
        raise DeviceFault("CUDA error: an illegal memory access was encountered")

    assert run_job(job_id, body, worker=w) is Delivery.DEVICE_FAULT
    record = isolated.job(job_id)
    assert record["status"] == "queued" and record["error"] is None
    assert w.faults and "illegal memory access" in w.faults[0]  # its worker takes itself out
    assert job_id in in_broker(isolated.settings.broker, {OWN})[0]  # published again


TWO = ["cpu:0", "cpu:1"]


@pytest.mark.parametrize(("fault", "leader_out", "suspect"), [
    (DeviceFault(CUDA_FAULT), True, ["cpu:1"]),
    (DeviceFault(CUDA_FAULT + " on gpu(1)", ("cpu:1",)), False, ["cpu:1"]),
    (DeviceFault(CUDA_FAULT, ("cpu:0",)), True, []),
], ids=["unnamed: every device", "names another", "names the leader's"])
def test_a_k_device_fault_takes_out_the_devices_it_may_have_come_from(
        isolated: Stack, fault: DeviceFault, leader_out: bool, suspect: list[str]) -> None:
    """Issue 60: a 2-device training's fault took out only its leader's device; the requeued job
    ran on the faulty one again. Unnamed, both go out (the other's worker before its next job);
    named, only that one. That worker defers the job it is handed and ends taken out."""
    s, w, job_id = isolated.settings, _worker(isolated), _job(isolated)

    def body(_job: JobContext) -> Outcome:
        raise fault

    assert run_job(job_id, body, admit=lambda job: list(TWO), worker=w) is Delivery.DEVICE_FAULT
    assert bool(w.faults) is leader_out
    assert sorted(suspects.pending(s.broker, NODE, TWO)) == suspect
    mate = Worker(Placement(worker=f"cpu1@{NODE}", node=NODE, device="cpu:1"), s, heartbeat=None)
    other = _job(isolated, device_queue(NODE, "cpu", 1))
    ran: list[int] = []

    def runs(job: JobContext) -> Outcome:
        ran.append(job.id)
        return Outcome(1, 1.0)

    assert run_job(other, runs, worker=mate) is (Delivery.DEFERRED if suspect else Delivery.SUCCEEDED)
    assert bool(mate.faults) is bool(suspect) and suspects.pending(s.broker, NODE, TWO) == set()
    if suspect:
        assert not ran and isolated.job(other)["status"] == "queued"
        assert f"device fault on cpu:0, cpu:1 during job {job_id}" in mate.faults[0]


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
    split = FanOut([_chunk(0, 2), _chunk(2, 4)])
    assert run_job(job_id, lambda _job: split, worker=_worker(isolated)) is Delivery.SPLIT
    chunks = chunk_statuses(isolated.settings.database, job_id, but=-1)
    assert sorted(chunks) == ["queued", "queued"]
    assert isolated.job(job_id)["status"] == "running"  # until its chunks end
    # A redelivery of the parent (its heartbeat is cleared once split) makes no chunk twice.
    assert run_job(job_id, lambda _job: split, worker=_worker(isolated)) is Delivery.SPLIT
    assert len(chunk_statuses(isolated.settings.database, job_id, but=-1)) == 2


def test_a_parent_settles_when_its_last_chunk_ends(isolated: Stack) -> None:
    """The frame's last step after every delivery settles the parent of a chunk: succeeded once
    every chunk did, with the samples of all."""
    w, job_id = _worker(isolated), _job(isolated)
    split = FanOut([_chunk(0, 2), _chunk(2, 4)], queues=[OWN, OWN])
    assert run_job(job_id, lambda _job: split, worker=w) is Delivery.SPLIT
    with session_scope(isolated.settings.database) as session:
        first, second = session.scalars(select(Job.id).where(Job.parent_id == job_id).order_by(Job.id))

    def body(job: JobContext) -> Outcome:
        chunk = job.params(InferParams)
        assert chunk.start is not None and chunk.stop is not None
        return Outcome(samples=chunk.stop - chunk.start, seconds=1.0)

    assert run_job(first, body, worker=w) is Delivery.SUCCEEDED
    assert isolated.job(job_id)["status"] == "running"
    assert run_job(second, body, worker=w) is Delivery.SUCCEEDED
    parent = isolated.job(job_id)
    assert (parent["status"], parent["samples"]) == ("succeeded", 4)


def _first_started(stack: Stack, job_id: int, moved_back: timedelta | None = None) -> datetime:
    """The job's first start (its time limit's clock), moved back by `moved_back` if given."""
    with session_scope(stack.settings.database) as session:
        job = session.get(Job, job_id)
        assert job is not None and job.first_started_at is not None
        if moved_back is not None:
            job.first_started_at -= moved_back
        return as_utc(job.first_started_at)


def test_a_time_limit_counts_from_the_first_start_across_attempts(isolated: Stack) -> None:
    """A later attempt keeps the first attempt's clock (a resumed job gets no fresh limit): past
    its limit, its next checkpoint fails it with one line naming the limit."""
    w, job_id = _worker(isolated), _job(isolated, params={"size": 16, "time_limit": 3600})
    clocks: list[datetime | None] = []

    def faulted(job: JobContext) -> Outcome:
        clocks.append(job.clock_from)
        job.check_time_limit(job.params(ProbeParams).time_limit, "unreachable: within its limit")
        raise DeviceFault("CUDA error: an illegal memory access was encountered")

    assert run_job(job_id, faulted, worker=w) is Delivery.DEVICE_FAULT  # queued again, no attempt
    first = _first_started(isolated, job_id, moved_back=timedelta(hours=2))

    def checkpoint(job: JobContext) -> Outcome:
        clocks.append(job.clock_from)
        job.check_time_limit(job.params(ProbeParams).time_limit, "stopped after round 1 of 10")
        raise AssertionError("unreachable: past its limit")

    assert run_job(job_id, checkpoint, worker=w) is Delivery.FAILED
    record = isolated.job(job_id)
    assert clocks[1] == first and clocks[0] is not None  # (the first, as the claim set it, or just after)
    assert timedelta(hours=2) <= clocks[0] - first < timedelta(hours=2, seconds=30)
    assert record["status"] == "failed", record
    assert re.fullmatch(r"time limit 1h reached after 72\d\d s: stopped after round 1 of 10",
                        record["error"] or ""), record["error"]


def test_a_chunk_counts_its_time_limit_from_its_parents_first_start(isolated: Stack) -> None:
    w, job_id = _worker(isolated), _job(isolated)
    split = FanOut([_chunk(0, 2).model_copy(update={"time_limit": 60})], queues=[OWN])
    assert run_job(job_id, lambda _job: split, worker=w) is Delivery.SPLIT
    parent_start = _first_started(isolated, job_id, moved_back=timedelta(minutes=5))
    with session_scope(isolated.settings.database) as session:
        chunk_id = session.scalars(select(Job.id).where(Job.parent_id == job_id)).one()
    seen: list[datetime | None] = []

    def body(job: JobContext) -> Outcome:
        seen.append(job.clock_from)
        job.check_time_limit(job.params(InferParams).time_limit, "stopped at sample 1 of [0, 2)")
        return Outcome(samples=2, seconds=1.0)

    assert run_job(chunk_id, body, worker=w) is Delivery.FAILED
    assert seen == [parent_start]
    assert (isolated.job(chunk_id)["error"] or "").startswith("time limit 1m reached after 30")


@dataclass
class Recorder:
    """A hook that notes its calls (and, with `fail`, raises in `after`; with `fail_before`, in
    `before`)."""

    name: str
    calls: list[str]
    fail: bool = False
    fail_before: bool = False

    def before(self, run: Run) -> None:
        self.calls.append(f"{self.name}.before {run.job_id}")
        if self.fail_before:
            raise RuntimeError(f"{self.name} broke before")

    def after(self, run: Run) -> None:
        self.calls.append(f"{self.name}.after {run.job_id}")
        if self.fail:
            raise RuntimeError(f"{self.name} broke")


def test_hooks_run_around_the_body_and_every_after_runs(isolated: Stack) -> None:
    """`before` in order once the job is claimed, `after` in reverse once its outcome is recorded,
    each `after` even when one raised (that error then reaches the caller); a delivery the
    claim refuses runs none."""
    calls: list[str] = []
    layers = (Recorder("a", calls), Recorder("b", calls, fail=True), Recorder("c", calls))
    w = Worker(AT, isolated.settings, heartbeat=None, middleware=layers)
    job_id = _job(isolated)

    def body(job: JobContext) -> Outcome:
        calls.append("body")
        return Outcome(1, 1.0)

    with pytest.raises(RuntimeError, match="b broke"):
        run_job(job_id, body, worker=w)
    assert calls == [f"a.before {job_id}", f"b.before {job_id}", f"c.before {job_id}", "body",
                     f"c.after {job_id}", f"b.after {job_id}", f"a.after {job_id}"]
    assert isolated.job(job_id)["status"] == "succeeded"  # recorded before the hooks' after
    calls.clear()
    assert run_job(job_id, body, worker=w) is Claim.FINISHED and calls == []


def test_a_before_that_raises_leaves_no_started_hook_without_its_after(isolated: Stack) -> None:
    """Issue 59: the `before` calls sat outside the `try`, so one that raised left the hooks
    already started (the job's log recording, the heartbeat naming the job) without their
    `after`. Those started get it; the one that raised and those after it run neither."""
    calls: list[str] = []
    layers = (Recorder("a", calls), Recorder("b", calls), Recorder("c", calls, fail_before=True),
             Recorder("d", calls))
    w = Worker(AT, isolated.settings, heartbeat=None, middleware=layers)
    job_id = _job(isolated)
    with pytest.raises(RuntimeError, match="c broke before"):
        run_job(job_id, lambda job: Outcome(1, 1.0), worker=w)
    assert calls == [f"a.before {job_id}", f"b.before {job_id}", f"c.before {job_id}",
                     f"b.after {job_id}", f"a.after {job_id}"]


def test_the_current_job_hook_names_the_job_to_the_heartbeat_while_it_runs(isolated: Stack) -> None:
    beat = Heartbeat(isolated.settings.database, AT.worker, 60.0)
    run = Run(7, None, isolated.settings, beat)
    CurrentJob().before(run)
    assert beat.current_job == 7
    CurrentJob().after(run)
    assert beat.current_job is None
    CurrentJob().before(Run(8, None, isolated.settings, None))  # a simulated worker has none


def test_the_parent_hook_settles_a_parent_once_its_last_chunk_ended(isolated: Stack) -> None:
    s = isolated.settings
    parent = _job(isolated)
    assert isinstance(jobs.take(s.database, parent, AT, 3, 60), Fence)
    [(first, _, _), (second, _, _)] = fan_out(
        s.database, parent, "infer", [stored(_chunk(0, 2)), stored(_chunk(2, 4))], OWN, "cpu:0", False)
    for chunk in (first, second):
        fence = jobs.take(s.database, chunk, AT, 3, 60)
        assert isinstance(fence, Fence) and jobs.succeed(s.database, fence, 2, 1.0, {})
        SettleParent().after(Run(chunk, parent, s, None))
        if chunk == first:  # one chunk still to end
            assert isolated.job(parent)["status"] == "running"
    assert (isolated.job(parent)["status"], isolated.job(parent)["samples"]) == ("succeeded", 4)
    SettleParent().after(Run(parent, None, s, None))  # a job without a parent: nothing to settle


def test_the_admission_hook_releases_a_held_job_when_a_run_ends(isolated: Stack) -> None:
    s = isolated.settings
    users.add(s.database, "q", Role.SUBMIT, Share(1.0, max_devices=1))
    running = jobs.create_job(s.database, "probe", {}, "cpu:0", OWN, owner="q")
    held = jobs.create_job(s.database, "probe", {}, "cpu:0", OWN, owner="q", held=True)
    fence = jobs.take(s.database, running, AT, 3, 60)
    assert isinstance(fence, Fence)
    AdmitNext().after(Run(running, None, s, None))
    assert held not in in_broker(s.broker, {OWN})[0]  # its owner's one device is in use
    assert jobs.succeed(s.database, fence, 1, 1.0, {})
    AdmitNext().after(Run(running, None, s, None))
    assert held in in_broker(s.broker, {OWN})[0]  # released: published to its queue


def test_a_runs_log_holds_its_workers_records_between_its_attempts_notes(
        isolated: Stack, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from mxq.db.outputs import logs

    job_id = _job(isolated)
    logging.getLogger("mxq.test").info("before the run: not the job's")

    def body(job: JobContext) -> Outcome:
        logging.getLogger("mxq.test").warning("inside job %s: bad\x00 \x1b[31mred", job.id)
        return Outcome(samples=1, seconds=1.0, result={})

    caplog.set_level(logging.INFO)  # as a worker logs (celery -l INFO)
    assert run_job(job_id, body, worker=_worker(isolated)) is Delivery.SUCCEEDED
    page = logs.read(isolated.settings.database, job_id)
    assert [(x["source"], x["text"]) for x in page["items"]] == [
        ("mxq", logs.started_note(1, AT.worker, ["cpu:0"])),
        ("worker", f"WARNING mxq.test: inside job {job_id}: bad [31mred"),
        ("mxq", logs.ended_note(1))]
    assert page["ended"]


def test_a_log_write_that_fails_never_fails_its_job(isolated: Stack,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from mxq.db.outputs import logs

    def broken(*_: object) -> None:
        raise RuntimeError("the log's table is gone")

    monkeypatch.setattr(logs, "append", broken)
    job_id = _job(isolated)
    assert run_job(job_id, lambda job: Outcome(samples=1, seconds=1.0, result={}),
                   worker=_worker(isolated)) is Delivery.SUCCEEDED
    assert isolated.job(job_id)["status"] == "succeeded"

