"""One submit path for one job and for many (`submit_jobs`, here as `submit_json`): a wrong
request is recorded as a failed job whichever the path, and an idempotency key returns the jobs
first made with it, on both backends. (A paused broker: tests/jobs/test_submit_deadline.py.)"""

from __future__ import annotations

import pytest

from mxq.db.reports.history import JobFilter, list_jobs
from mxq.errors import JobRejected
from mxq.workers.broker.messages import in_broker
from mxq.workers.jobs.jobspecs import ParamsError
from mxq.workers.jobs.submit import IdempotencyConflict, submit_json, submit_request
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs

GOOD = {"size": 16, "batch": 1, "repeat": 1}


def _statuses(stack: Stack) -> list[tuple[str, str | None]]:
    return [(j["status"], j["error"]) for j in list_jobs(stack.settings.database, JobFilter(limit=10))]


def test_a_wrong_job_in_a_batch_is_recorded_and_nothing_else_is_queued(isolated: Stack) -> None:
    with pytest.raises(JobRejected) as batch:
        submit_json(isolated.settings, "probe", [GOOD, GOOD, {**GOOD, "size": 1}], "cpu:0",
                    allow_offline=True)
    assert "job 2 of 3 (nothing else was queued)" in str(batch.value) and "size=1" in str(batch.value)
    with pytest.raises(JobRejected) as one:
        submit_request(isolated.settings, "probe", {**GOOD, "size": 1}, "cpu:0", allow_offline=True)
    recorded = _statuses(isolated)
    assert [status for status, _ in recorded] == ["failed", "failed"]  # both, and nothing else
    assert {batch.value.job_id, one.value.job_id} == {j["id"] for j in list_jobs(
        isolated.settings.database, JobFilter(limit=10))}
    assert all(error and "size=1" in error for _, error in recorded)


def test_a_batch_is_queued_and_published_whole(isolated: Stack) -> None:
    done = submit_json(isolated.settings, "probe", [GOOD] * 3, "cpu:0", allow_offline=True)
    ids = [d.job_id for d in done]
    assert [d.published for d in done] == [True] * 3 and _statuses(isolated) == [("queued", None)] * 3
    queue = isolated.job(ids[0])["queue"]
    assert queue is not None and in_broker(isolated.settings.broker, {queue})[0] == set(ids)


def test_an_idempotency_key_returns_a_batch_as_it_returns_one_job(isolated: Stack) -> None:
    s = isolated.settings
    first = submit_json(s, "probe", [GOOD, {**GOOD, "size": 32}], "cpu:0", allow_offline=True,
                        idempotency_key="nightly-7")
    again = submit_json(s, "probe", [GOOD, {**GOOD, "size": 32}], "cpu:0", allow_offline=True,
                        idempotency_key="nightly-7")
    assert [a.job_id for a in again] == [f.job_id for f in first]
    assert all(a.replayed and a.published is None and a.note and "nightly-7" in a.note for a in again)
    with pytest.raises(IdempotencyConflict):  # the same key, another batch
        submit_json(s, "probe", [GOOD, GOOD], "cpu:0", allow_offline=True, idempotency_key="nightly-7")
    with pytest.raises(IdempotencyConflict):  # the same key, one job of the batch's
        submit_request(s, "probe", GOOD, "cpu:0", allow_offline=True, idempotency_key="nightly-7")
    single = submit_request(s, "probe", GOOD, "cpu:0", allow_offline=True, idempotency_key="one-7")
    assert submit_request(s, "probe", GOOD, "cpu:0", allow_offline=True,
                          idempotency_key="one-7").job_id == single.job_id
    assert len(list_jobs(s.database, JobFilter(limit=10))) == 3
    with pytest.raises(ParamsError, match="too long for a batch of 2 jobs: at most 126"):
        submit_json(s, "probe", [GOOD, GOOD], "cpu:0", allow_offline=True, idempotency_key="k" * 128)
