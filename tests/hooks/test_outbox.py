"""The outbox in SQL and the sender driven by a clock: an event is written with the change it
reports or not at all, only for the endpoints that want it; a failed delivery is retried with
doubling waits and given up after a day; two senders never make the same attempt; the allowlist
refuses a host it does not list, and a private address it does not name."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from mxq.db import jobs, registry
from mxq.db.engine import session_scope
from mxq.db.schema import as_utc, utcnow
from mxq.db.webhooks import endpoints, outbox
from mxq.errors import UserError
from mxq.workers.settings import Settings
from mxq.workers.webhooks import sender, targets
from tests.conftest import Stack
from tests.hooks.receiver import Receiver, receiving

pytestmark = pytest.mark.both_legs  # guarded UPDATEs and JSON columns on both backends

LOCAL = "127.0.0.1"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


def _settings(stack: Stack, **more: object) -> Settings:
    return stack.settings.model_copy(update={"hook_allowed_hosts": LOCAL, "hook_timeout_seconds": 2.0,
                                             **more})


def _hook(s: Settings, receiver: Receiver, path: str, events: list[str]) -> int:
    created = sender.add_hook(s, receiver.url(path), events, "admin")
    receiver.add(path, created)
    return created["id"]


def _job(s: Settings) -> int:
    return jobs.create_job(s.database, "probe", {}, "cpu:0", "node.cpu.0")


def test_an_event_is_written_with_its_change_for_the_endpoints_that_want_it(isolated: Stack,
                                                                            receiver: Receiver) -> None:
    s = _settings(isolated)
    failed_hook = _hook(s, receiver, "/ok", ["job.failed"])
    _hook(s, receiver, "/other", ["version.promoted"])
    job_id = _job(s)
    assert jobs.fail(s.database, job_id, "boom")
    rows = outbox.list_deliveries(s.database)
    assert [(r["hook_id"], r["event"], r["status"]) for r in rows] == [(failed_hook, "job.failed", "pending")]
    assert rows[0]["payload"]["job"]["id"] == job_id and rows[0]["payload"]["job"]["error"] == "boom"
    assert rows[0]["id"].startswith("dlv_")

    with pytest.raises(RuntimeError), session_scope(s.database) as session:  # rolled back: no event
        outbox.emit(session, "job.failed", {"job": {"id": 0}})
        raise RuntimeError("the change failed")
    assert len(outbox.list_deliveries(s.database)) == 1

    record = {"name": "hooked", "version": 1, "arch": "mlp", "input_shape": [4], "classes": 2,
              "params_file": "p", "symbol_file": "s", "checksum": "0" * 64, "source": "test"}
    registry.add_model(s.database, record)  # version.registered: no endpoint wants it
    registry.promote(s.database, "hooked", 1)
    registry.promote(s.database, "hooked", 1)  # promoted already: no second event
    promoted = outbox.list_deliveries(s.database, None, "pending")
    assert sorted(r["event"] for r in promoted) == ["job.failed", "version.promoted"]
    assert next(r for r in promoted if r["event"] == "version.promoted")["payload"]["model"]["version"] == 1


def test_retries_double_until_a_day_is_over_then_give_up(isolated: Stack, receiver: Receiver) -> None:
    s = _settings(isolated)
    _hook(s, receiver, "/down", ["job.failed"])
    jobs.fail(s.database, _job(s), "boom")
    [row] = outbox.list_deliveries(s.database)
    now = utcnow()
    waits = []
    while True:
        assert sender.send_due(s, now, wait=True) == 1
        [row] = outbox.list_deliveries(s.database)
        if row["status"] != "failed":
            break
        assert row["last_code"] == 500 and row["last_error"] == "answered 500"
        assert sender.send_due(s, now + timedelta(seconds=1), wait=True) == 0  # not due yet
        later = as_utc(datetime.fromisoformat(str(row["next_attempt_at"])))
        waits.append((later - now).total_seconds())
        now = later
    assert row["status"] == "gave_up"
    assert waits[:4] == [30, 60, 120, 240] and max(waits) == 3600
    assert row["attempts"] == len(receiver.on("/down")) == len(waits) + 1
    assert len({r.delivery for r in receiver.on("/down")}) == 1  # one delivery id throughout
    assert all(receiver.verified(r) for r in receiver.on("/down"))


def test_two_senders_never_make_the_same_attempt(isolated: Stack, receiver: Receiver) -> None:
    s = _settings(isolated)
    _hook(s, receiver, "/ok", ["job.failed"])
    jobs.fail(s.database, _job(s), "boom")
    now = utcnow()
    first = outbox.claim_due(s.database, now, 10)
    assert [c.attempt for c in first] == [1]
    assert outbox.claim_due(s.database, now, 10) == []  # claimed: leased past its send
    assert "secret" not in repr(first[0]) and first[0].secret not in repr(first[0])
    assert outbox.settle(s.database, first[0], now, 200, None) == "delivered"
    assert outbox.settle(s.database, first[0], now, 500, None) == "failed"  # the same attempt
    stale = outbox.Claimed(**{**first[0].__dict__, "attempt": 7})
    assert outbox.settle(s.database, stale, now, 200, None) is None  # not this attempt's


def test_the_allowlist_refuses_unlisted_hosts_and_unnamed_private_addresses(isolated: Stack) -> None:
    s = isolated.settings
    url = "http://127.0.0.1:9/hook"
    with pytest.raises(targets.HookRefused, match="MXQ_HOOK_ALLOWED_HOSTS is unset"):
        sender.add_hook(s, url, ["job.failed"], "admin")
    with pytest.raises(targets.HookRefused, match=r"host 127\.0\.0\.1 is not in MXQ_HOOK_ALLOWED_HOSTS"):
        sender.add_hook(_settings(isolated, hook_allowed_hosts="hooks.example.com,*.example.com"),
                        url, ["job.failed"], "admin")
    # listed by name, but its address is loopback, which only an address or network listed opens
    with pytest.raises(targets.HookRefused, match="a private, loopback or reserved address"):
        sender.add_hook(_settings(isolated, hook_allowed_hosts="localhost"),
                        "http://localhost:9/hook", ["job.failed"], "admin")
    with pytest.raises(targets.HookRefused, match="must not hold credentials"):
        sender.add_hook(_settings(isolated), "http://u:p@127.0.0.1/", ["job.failed"], "admin")
    with pytest.raises(UserError, match="unknown webhook event"):
        sender.add_hook(_settings(isolated), url, ["job.done"], "admin")
    assert endpoints.list_hooks(s.database) == []


def test_a_removed_admins_endpoints_stop_sending(isolated: Stack, receiver: Receiver) -> None:
    """Issue 58: an endpoint an admin added kept sending after `mxq users rm`: the removal
    pauses it, and a delivery to it is never claimed, even if it is enabled again."""
    from sqlalchemy import update

    from mxq.db.schema import Hook
    from mxq.db.sharing import users
    from mxq.users import Role

    s = _settings(isolated)
    users.add(s.database, "eve", Role.ADMIN)
    eves = sender.add_hook(s, receiver.url("/ok"), ["job.failed"], "eve")["id"]
    kept = _hook(s, receiver, "/other", ["job.failed"])
    assert jobs.fail(s.database, _job(s), "boom")
    users.remove(s.database, "eve")
    assert [h["enabled"] for h in endpoints.list_hooks(s.database) if h["id"] == eves] == [False]
    with session_scope(s.database) as session:  # enabled again by hand: still never sent
        session.execute(update(Hook).where(Hook.id == eves).values(enabled=True))
    assert [c.hook_id for c in outbox.claim_due(s.database, utcnow(), 10)] == [kept]


def test_a_dribbling_endpoint_is_cut_at_the_attempts_total_deadline(isolated: Stack,
                                                                     receiver: Receiver) -> None:
    """Issue 58: MXQ_HOOK_TIMEOUT_SECONDS bounded each read, not the attempt, so an endpoint that
    answers a byte every half second (a 200, after 20 s) held its thread that long. The attempt
    now fails at its deadline, 1.5 s after it began."""
    s = _settings(isolated, hook_timeout_seconds=1.5)
    slow = _hook(s, receiver, "/dribble", ["job.failed"])
    assert jobs.fail(s.database, _job(s), "boom")
    assert sender.send_due(s, utcnow(), wait=True) == 1
    [cut] = outbox.list_deliveries(s.database, slow)
    assert (cut["status"], cut["last_code"]) == ("failed", None)
    assert cut["last_error"] == "no answer within 1.5 s (MXQ_HOOK_TIMEOUT_SECONDS)"


def test_a_hung_endpoint_holds_two_senders_while_the_rest_deliver(isolated: Stack,
                                                                  receiver: Receiver) -> None:
    """Issue 58: one endpoint that hung stalled every other endpoint's deliveries (a pass took 8
    and waited on them). Now at most PER_ENDPOINT of its attempts are in flight, and the other
    senders deliver everything else in the same pass, one delivery after another."""
    s = _settings(isolated, hook_timeout_seconds=1.0)
    hung = _hook(s, receiver, "/hang", ["job.failed"])
    fast = _hook(s, receiver, "/ok", ["job.failed"])
    for _ in range(6):  # 6 events: 6 due to each endpoint, the hung one's first
        assert jobs.fail(s.database, _job(s), "boom")
    assert sender.send_due(s, utcnow(), wait=True) == 12
    ok = outbox.list_deliveries(s.database, fast, limit=100)
    assert [d["status"] for d in ok] == ["delivered"] * 6
    late = outbox.list_deliveries(s.database, hung, limit=100)
    assert [d["status"] for d in late] == ["failed"] * 6
    assert len([r for r in receiver.got if r.path == "/hang"]) == 6
