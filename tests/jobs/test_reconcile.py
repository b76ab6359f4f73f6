"""The reconciler against a real broker and database with no workers: every state it repairs is
made for real (a message deleted from Redis, a heartbeat gone stale, a lease left behind)."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from mxq.db import events, schedules
from mxq.db.engine import session_scope
from mxq.db.schema import Fire, Job, utcnow
from mxq.workers.broker import deadletters
from mxq.workers.broker.messages import PRIORITY_SEP, UNACKED, UNACKED_INDEX, in_broker, stored_names
from mxq.workers.broker.redis_client import client
from mxq.workers.fleet import leases
from mxq.workers.jobs.submit import submit
from mxq.workers.repair.reconcile import UNACKED_GRACE_SECONDS, reconcile
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs


def _probe(stack: Stack) -> int:
    return submit(stack.settings, "probe", {"size": 16, "batch": 1, "repeat": 1}, "cpu:0",
                  allow_offline=True)


def _set(stack: Stack, job_id: int, **values: object) -> None:
    with session_scope(stack.settings.database) as s:
        s.execute(update(Job).where(Job.id == job_id).values(**values))


def _age(stack: Stack, job_id: int, seconds: float = 60) -> None:
    _set(stack, job_id, submitted_at=utcnow() - timedelta(seconds=seconds))


def _queue(stack: Stack, job_id: int) -> str:
    queue = stack.job(job_id)["queue"]
    assert queue is not None
    return queue


def _list(queue: str) -> str:
    """The Redis list a normal job's new message waits in (`publish.Turn`)."""
    return f"{queue}{PRIORITY_SEP}3"


def _take_all(stack: Stack, queue: str) -> None:
    """Every message of `queue` gone, as when its worker took them."""
    client(stack.settings.broker).delete(*stored_names({queue}))


def test_a_queued_job_whose_message_was_lost_is_published_again(isolated: Stack) -> None:
    lost, kept, fresh = _probe(isolated), _probe(isolated), _probe(isolated)
    for job_id in (lost, kept):
        _age(isolated, job_id)
    r = client(isolated.settings.broker)
    queue = _queue(isolated, lost)
    # Drop only the lost job's message (and the fresh one's: it is inside the submit grace).
    for raw in r.lrange(_list(queue), 0, -1):
        if f'"job-{lost}"' in raw or f'"job-{fresh}"' in raw:
            assert isinstance(raw, str)  # the client decodes replies
            r.lrem(_list(queue), 1, raw)
    assert in_broker(isolated.settings.broker, {queue})[0] == {kept}

    report = reconcile(isolated.settings)

    assert report.republished == [lost]
    assert in_broker(isolated.settings.broker, {queue})[0] == {lost, kept}
    kinds = [e["kind"] for e in events.list_events(isolated.settings.database, lost)]
    assert kinds == [events.REPUBLISHED]
    assert events.list_events(isolated.settings.database, kept) == []
    shown = isolated.mxq("job", str(lost))
    assert shown.returncode == 0 and "republished" in shown.stdout and "events" in shown.stdout
    assert isolated.mxq_json("job", str(lost))["events"][0]["kind"] == events.REPUBLISHED
    assert reconcile(isolated.settings).republished == []  # its message is there now


def _hold(stack: Stack, job_id: int, age: float) -> str:
    """Move the job's message to kombu's unacked set, delivered `age` seconds ago."""
    r = client(stack.settings.broker)
    queue = _queue(stack, job_id)
    [raw] = [m for m in r.lrange(_list(queue), 0, -1) if f'"job-{job_id}"' in m]
    assert isinstance(raw, str)  # the client decodes replies
    r.lrem(_list(queue), 1, raw)
    tag = f"tag-{job_id}"
    r.hset(UNACKED, tag, json.dumps([json.loads(raw), "", queue]))
    r.zadd(UNACKED_INDEX, {tag: time.time() - age})
    return tag


def test_a_message_held_by_a_consumer_that_is_gone_is_published_again(isolated: Stack) -> None:
    orphaned, claiming = _probe(isolated), _probe(isolated)
    for job_id in (orphaned, claiming):
        _age(isolated, job_id)
    old = _hold(isolated, orphaned, age=UNACKED_GRACE_SECONDS + 5)
    _hold(isolated, claiming, age=0.5)  # a worker took it a moment ago and is claiming it

    report = reconcile(isolated.settings)

    assert report.republished == [orphaned]
    waiting, held = in_broker(isolated.settings.broker, {_queue(isolated, orphaned)})
    assert waiting == {orphaned} and set(held) == {claiming}
    assert old not in client(isolated.settings.broker).hkeys(UNACKED)
    [event] = events.list_events(isolated.settings.database, orphaned)
    assert "held unacknowledged" in event["message"]


def test_a_finished_jobs_message_left_unacknowledged_is_dropped(isolated: Stack) -> None:
    """Its ack was lost with the connection at a broker restart: Redis would hand it out again
    hours later, and until then it would stay in the unacked set."""
    done, finishing = _probe(isolated), _probe(isolated)
    old, recent = _hold(isolated, done, age=UNACKED_GRACE_SECONDS + 5), _hold(isolated, finishing, age=1)
    for job_id in (done, finishing):
        _set(isolated, job_id, status="succeeded", finished_at=utcnow())

    assert reconcile(isolated.settings).republished == []

    unacked = client(isolated.settings.broker).hkeys(UNACKED)
    assert old not in unacked and recent in unacked  # an ack may still be on its way


def test_a_running_job_with_a_dead_heartbeat_is_requeued_then_failed_at_the_cap(isolated: Stack) -> None:
    job_id = _probe(isolated)
    queue = _queue(isolated, job_id)
    _take_all(isolated, queue)  # its worker took the message, then died
    stale = utcnow() - timedelta(seconds=isolated.settings.heartbeat_ttl * 3)
    _set(isolated, job_id, status="running", worker="cpu0@gone", attempts=1, heartbeat_at=stale)

    report = reconcile(isolated.settings)

    assert report.requeued == [job_id]
    assert in_broker(isolated.settings.broker, {queue})[0] == {job_id}
    job = isolated.job(job_id)
    assert job["status"] == "running" and job["attempts"] == 1
    [event] = events.list_events(isolated.settings.database, job_id)
    assert event["kind"] == events.REQUEUED and "heartbeat" in event["message"]

    _take_all(isolated, queue)
    _set(isolated, job_id, attempts=isolated.settings.max_attempts, heartbeat_at=stale)
    assert reconcile(isolated.settings).failed == [job_id]
    job = isolated.job(job_id)
    assert job["status"] == "failed" and "gave up after 3 attempts" in (job["error"] or "")


def test_a_running_job_with_a_live_heartbeat_is_left_alone(isolated: Stack) -> None:
    job_id = _probe(isolated)
    _take_all(isolated, _queue(isolated, job_id))
    _set(isolated, job_id, status="running", worker="cpu0@busy", attempts=1, heartbeat_at=utcnow())
    assert reconcile(isolated.settings).empty()
    assert isolated.job(job_id)["status"] == "running"


def _stuck(isolated: Stack) -> tuple[int, int]:
    """Two running jobs with live heartbeats: one without progress for an hour, one whose cancel,
    asked an hour ago, it did not heed."""
    hour_ago = utcnow() - timedelta(hours=1)
    stalled, deaf = _probe(isolated), _probe(isolated)
    for job_id in (stalled, deaf):
        _take_all(isolated, _queue(isolated, job_id))
        _set(isolated, job_id, status="running", worker="cpu0@busy", attempts=1, heartbeat_at=utcnow(),
             started_at=hour_ago, progress_at=hour_ago if job_id == stalled else utcnow())
    _set(isolated, deaf, cancel_requested_at=hour_ago)
    return stalled, deaf


def test_jobs_stuck_in_spite_of_live_heartbeats_are_ended_with_the_reason(isolated: Stack) -> None:
    stalled, deaf = _stuck(isolated)

    report = reconcile(isolated.settings)

    assert (report.stalled, report.cancels_enforced) == ([stalled], [deaf])
    for job_id, status, why in ((stalled, "failed", "MXQ_STALL_SECONDS"),
                                (deaf, "cancelled", "MXQ_CANCEL_GRACE_SECONDS")):
        job = isolated.job(job_id)
        assert job["status"] == status and why in (job["error"] or ""), job
        [event] = events.list_events(isolated.settings.database, job_id)
        assert event["kind"] == events.STALLED and event["message"] == job["error"]
    assert reconcile(isolated.settings).empty()  # ended once, one event each


def test_a_job_is_ended_by_the_reconciler_only_together_with_its_event(
        isolated: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end and its `stalled` event are one transaction: a reader who sees the job ended sees
    why (CI once read a job cancelled by the reconciler before its event was written)."""
    stalled, deaf = _stuck(isolated)

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("the event could not be written")

    monkeypatch.setattr(events, "add", broken)
    with pytest.raises(RuntimeError, match="could not be written"):
        reconcile(isolated.settings)
    assert [isolated.job(j)["status"] for j in (stalled, deaf)] == ["running", "running"]
    monkeypatch.undo()
    assert (reconcile(isolated.settings).stalled, isolated.job(stalled)["status"]) == ([stalled], "failed")


def test_a_parent_whose_chunks_all_finished_is_settled_with_its_event(isolated: Stack) -> None:
    parent, first, second = _probe(isolated), _probe(isolated), _probe(isolated)
    for job_id in (parent, first, second):
        _take_all(isolated, _queue(isolated, job_id))
    _set(isolated, parent, status="running", worker="cpu0@busy", attempts=1, heartbeat_at=utcnow(),
         chunks=2)
    for index, job_id in enumerate((first, second)):
        _set(isolated, job_id, parent_id=parent, chunk_index=index, status="succeeded", samples=10,
             seconds=1.0, started_at=utcnow(), finished_at=utcnow())

    assert reconcile(isolated.settings).settled == [parent]

    assert isolated.job(parent)["status"] == "succeeded"
    [event] = events.list_events(isolated.settings.database, parent)
    assert event["kind"] == events.SETTLED and "every chunk had finished" in event["message"]
    assert reconcile(isolated.settings).settled == []


def test_leases_of_finished_or_dead_holders_are_freed(isolated: Stack) -> None:
    s = isolated.settings
    done, alive = _probe(isolated), _probe(isolated)
    _set(isolated, done, status="succeeded", finished_at=utcnow())
    _set(isolated, alive, status="running", worker="cpu1@x", heartbeat_at=utcnow())
    assert leases.acquire(s.broker, s.node, ["cpu:0"], done, ttl=600)
    assert leases.acquire(s.broker, s.node, ["cpu:1"], alive, ttl=600)

    report = reconcile(s)

    assert report.leases_freed == [leases.key(s.node, "cpu:0")]
    assert leases.holders(s.broker, s.node, ["cpu:0", "cpu:1"]) == {"cpu:0": None, "cpu:1": alive}
    assert [e["kind"] for e in events.list_events(s.database, done)] == [events.LEASE_FREED]


def test_a_fire_whose_tick_died_before_submitting_gets_its_job(isolated: Stack) -> None:
    from tests.support.schedules import add_retraining, fresh_dataset

    fresh_dataset(isolated)
    sched = add_retraining(isolated, "nightly", "0 3 * * *", now=utcnow())
    sched_id = schedules.get(isolated.settings.database, "nightly")["id"]
    fire_id = schedules.record_manual(isolated.settings.database, sched_id, utcnow())
    with session_scope(isolated.settings.database) as s:  # the tick died right here, long ago
        s.execute(update(Fire).where(Fire.id == fire_id)
                  .values(fired_at=utcnow() - timedelta(minutes=5)))

    report = reconcile(isolated.settings)

    assert report.fires_submitted == [fire_id] and sched["name"] == "nightly"
    [fire] = schedules.fires(isolated.settings.database, "nightly")
    assert fire["job_id"] is not None
    job = isolated.job(fire["job_id"])
    assert job["kind"] == "train" and job["status"] == "queued"
    assert [e["kind"] for e in events.list_events(isolated.settings.database, job["id"])] == \
        [events.RESUBMITTED]
    assert reconcile(isolated.settings).fires_submitted == []


@pytest.mark.parametrize("poison", ["5", "[1, 2]", "not json", '{"body": "x"}'])
def test_poison_beside_a_queued_job_is_moved_aside_and_lost_messages_still_republished(
        isolated: Stack, poison: str) -> None:
    """A bare number in a queue once made every reconciler pass fail ('int' object has no
    attribute 'get'), so lost messages were no longer republished."""
    lost, kept = _probe(isolated), _probe(isolated)
    for job_id in (lost, kept):
        _age(isolated, job_id)
    r = client(isolated.settings.broker)
    queue = _queue(isolated, lost)
    for raw in r.lrange(_list(queue), 0, -1):
        if f'"job-{lost}"' in raw:
            assert isinstance(raw, str)  # the client decodes replies
            r.lrem(_list(queue), 1, raw)
    r.lpush(queue, poison)

    report = reconcile(isolated.settings)

    assert report.republished == [lost] and report.dead_lettered == [queue]
    assert in_broker(isolated.settings.broker, {queue})[0] == {lost, kept}
    assert poison not in r.lrange(queue, 0, -1)
    newest = deadletters.listed(r)[0]
    assert newest["queue"] == queue and newest["message"] == poison and newest["reason"]
    assert reconcile(isolated.settings).dead_lettered == []  # moved once, not met again


def test_mxq_dead_letters_shows_and_clears_them(isolated: Stack) -> None:
    r = client(isolated.settings.broker)
    for item in ("5", "{}"):
        r.lpush("pool.cpu", item)
    assert reconcile(isolated.settings).dead_lettered == ["pool.cpu", "pool.cpu"]
    shown = isolated.mxq_json("dead-letters")
    assert sorted((d["queue"], d["message"]) for d in shown) == [("pool.cpu", "5"), ("pool.cpu", "{}")]
    table = isolated.mxq("dead-letters")
    assert table.returncode == 0 and "not a message envelope but a JSON int" in table.stdout
    cleared = isolated.mxq("dead-letters", "--clear")
    assert cleared.returncode == 0 and "cleared 2 dead letters" in cleared.stdout
    assert isolated.mxq_json("dead-letters") == []
