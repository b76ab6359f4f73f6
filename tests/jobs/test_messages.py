"""Job messages in the real broker: which are waiting, and dropping those of jobs already taken."""

from __future__ import annotations

import pytest

from mxq.workers.broker.messages import PRIORITY_SEP, drop_waiting, in_broker, stored_names
from mxq.workers.broker.redis_client import client
from mxq.workers.jobs.submit import submit_many
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs

PROBE = {"size": 16, "batch": 1, "repeat": 1}


def test_drop_waiting_removes_only_the_named_jobs_messages(isolated: Stack) -> None:
    s = isolated.settings
    ids = submit_many(s, "probe", [PROBE] * 5, "cpu:0", allow_offline=True)
    queue = isolated.job(ids[0])["queue"]
    assert queue is not None
    r = client(s.broker)
    normal = f"{queue}{PRIORITY_SEP}3"  # where kombu stores a normal job's message (`publish.Turn`)
    # One message moved to another priority's list, as kombu stores a low job's.
    [raw] = [m for m in r.lrange(normal, 0, -1) if f'"job-{ids[1]}"' in m]
    assert isinstance(raw, str)  # the client decodes replies
    r.lrem(normal, 1, raw)
    r.lpush(f"{queue}{PRIORITY_SEP}5", raw)
    r.lpush(normal, "not a kombu message")  # anything else in a list is left alone

    assert drop_waiting(s.broker, [queue], [ids[1], ids[3], 10**9]) == 2

    assert in_broker(s.broker, {queue})[0] == {ids[0], ids[2], ids[4]}
    assert "not a kombu message" in r.lrange(normal, 0, -1)
    assert drop_waiting(s.broker, [queue], [ids[1]]) == 0  # nothing left to drop
    assert drop_waiting(s.broker, [queue], []) == 0
    assert {queue, normal, f"{queue}{PRIORITY_SEP}5"} <= set(stored_names({queue}))
