"""Admission in SQL and the real broker, on SQLite and PostgreSQL: held jobs are released in fair
order, each exactly once, and a queued job that is held is never published by the reconciler."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from mxq.db import jobs
from mxq.db.engine import session_scope
from mxq.db.schema import Job, utcnow
from mxq.db.sharing import admission, users
from mxq.shares import Share
from mxq.users import Role
from mxq.workers.broker.messages import in_broker
from mxq.workers.jobs import admit
from mxq.workers.repair.reconcile import reconcile
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs
QUEUE = "testnode.cpu.0"


def _job(stack: Stack, owner: str, **done: Any) -> int:
    job_id = jobs.create_job(stack.settings.database, "probe", {}, "cpu:0", QUEUE, owner=owner,
                             held=not done)
    if done:  # a finished job: device-seconds its owner used
        with session_scope(stack.settings.database) as s:
            s.execute(update(Job).where(Job.id == job_id).values(status="succeeded", **done))
    return job_id


def test_the_owner_furthest_below_its_share_is_admitted_first_and_once(isolated: Stack) -> None:
    s = isolated.settings
    users.add(s.database, "a", Role.SUBMIT, Share(1.0))
    users.add(s.database, "b", Role.SUBMIT, Share(3.0))
    assert admission.active(s.database)
    now = utcnow()
    _job(isolated, "a", started_at=now - timedelta(seconds=20), finished_at=now - timedelta(seconds=10))
    _job(isolated, "b", started_at=now - timedelta(seconds=30), finished_at=now - timedelta(seconds=10))
    first_a, first_b = _job(isolated, "a"), _job(isolated, "b")
    old = now - timedelta(minutes=5)  # past the reconciler's grace: a lost message would be republished
    with session_scope(s.database) as session:
        session.execute(update(Job).where(Job.id.in_([first_a, first_b])).values(submitted_at=old))

    assert admit.admit(s) == [first_b]  # b used 20 s of weight 3, a 10 s of weight 1; room for one
    assert admission.release(s.database, first_b) is None  # released once
    assert in_broker(s.broker, {QUEUE})[0] == {first_b}
    assert admit.reasons(s)[first_a].startswith("held: released by fair share as devices free")
    assert reconcile(s).republished == []  # a held job has no message, and is not lost
    assert in_broker(s.broker, {QUEUE})[0] == {first_b}


def test_a_quota_holds_jobs_whatever_the_room(isolated: Stack) -> None:
    s = isolated.settings
    users.add(s.database, "q", Role.SUBMIT, Share(1.0, max_devices=1))
    held = [_job(isolated, "q") for _ in range(3)]
    assert admit.admit(s) == held[:1]
    with session_scope(s.database) as session:  # the broker gives it room again: still one at once
        session.execute(update(Job).where(Job.id == held[0]).values(status="running"))
    assert admit.admit(s) == []
    assert admit.reasons(s)[held[1]] == "waiting: quota 1 device, 1 in use"


def test_concurrent_passes_release_no_more_than_the_quota(isolated: Stack,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Four passes at once (at a job's end, at a submit, in the reconciler): each has read the
    owner's use and the broker's room before any releases, were they not one at a time; one
    job goes, not four."""
    s = isolated.settings
    users.add(s.database, "race", Role.SUBMIT, Share(1.0, max_devices=1))
    held = [_job(isolated, "race") for _ in range(4)]
    meet = threading.Barrier(4)
    read = admit._Broker.read

    def read_then_meet(settings: Any, queues: set[str]) -> Any:
        room = read(settings, queues)
        try:  # unserialized, all four get here with the same stale view before any release
            meet.wait(timeout=2)
        except threading.BrokenBarrierError:
            pass  # serialized: the others wait for the lock, not here
        return room

    monkeypatch.setattr(admit._Broker, "read", staticmethod(read_then_meet))
    with ThreadPoolExecutor(4) as pool:
        released = [i for ids in pool.map(lambda _: admit.admit(s), range(4)) for i in ids]
    assert released == held[:1]
    assert admit.reasons(s)[held[1]] == "waiting: quota 1 device, 1 in use"
