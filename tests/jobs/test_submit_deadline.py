"""A submit against a paused broker (SIGSTOP: it accepts connections and never answers) answers
within MXQ_BROKER_TIMEOUT_SECONDS, leaves its jobs queued, says they are not published, and the
reconciler publishes them once the broker answers; a retry with the same idempotency key returns
those jobs meanwhile without asking the broker. One job and a batch answer alike.

The embedded leg only: the system leg's Redis is the machine's, shared (the fault suite pauses
a private one: tests/faults/test_broker_pause.py)."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from sqlalchemy import update

from mxq.db.engine import session_scope
from mxq.db.schema import Job, utcnow
from mxq.workers.broker.messages import look
from mxq.workers.jobs.submit import submit_json, submit_request
from mxq.workers.repair.reconcile import reconcile
from tests.conftest import Stack, paused

PROBE = {"size": 16, "batch": 1, "repeat": 1}


def _paused(stack: Stack) -> contextlib.AbstractContextManager[None]:
    return paused(int((stack.home / "redis.pid").read_text().strip()))


def test_a_paused_broker_leaves_the_job_queued_for_the_reconciler(isolated: Stack) -> None:
    s = isolated.settings.model_copy(update={"broker_timeout_seconds": 1.0})
    with _paused(isolated):
        done = submit_request(s, "probe", dict(PROBE), "cpu:0", allow_offline=True,
                              idempotency_key="pause-1")
        again = submit_request(s, "probe", dict(PROBE), "cpu:0", allow_offline=True,
                               idempotency_key="pause-1")
    assert done.published is False and not done.replayed
    assert done.note and "did not answer" in done.note and "the reconciler publishes it" in done.note
    assert again.replayed and again.job_id == done.job_id and again.published is None
    assert isolated.job(done.job_id)["status"] == "queued"  # kept, not deleted
    with session_scope(s.database) as session:  # past the reconciler's grace for fresh submits
        session.execute(update(Job).where(Job.id == done.job_id)
                        .values(submitted_at=utcnow() - timedelta(minutes=1)))
    queue = isolated.job(done.job_id)["queue"]
    assert queue is not None
    found = look(s.broker, {"node.cpu.0", queue})
    if done.job_id not in found.waiting:  # the late publish thread may have landed it meanwhile
        assert done.job_id in reconcile(s).republished
    assert done.job_id in look(s.broker, {queue}).waiting


def test_a_batch_against_a_paused_broker_is_queued_for_the_reconciler_as_one_job_is(
        isolated: Stack) -> None:
    """A batch once wrote nothing when the broker's check timed out, and raised after writing
    its rows when the publish did: now it answers as one job does."""
    s = isolated.settings.model_copy(update={"broker_timeout_seconds": 1.0})
    with _paused(isolated):
        done = submit_json(s, "probe", [dict(PROBE)] * 3, "cpu:0", allow_offline=True,
                           idempotency_key="pause-3")
        again = submit_json(s, "probe", [dict(PROBE)] * 3, "cpu:0", allow_offline=True,
                            idempotency_key="pause-3")
    ids = [d.job_id for d in done]
    assert len(set(ids)) == 3 and [d.published for d in done] == [False] * 3
    assert all(d.note and "the reconciler publishes it" in d.note for d in done)
    assert [a.job_id for a in again] == ids and all(a.replayed and a.published is None for a in again)
    assert [isolated.job(i)["status"] for i in ids] == ["queued"] * 3
