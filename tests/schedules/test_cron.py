"""Cron times in a time zone, across daylight-saving changes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from mxq.workers.schedules.cron import CronError, check, due, next_after

BERLIN = "Europe/Berlin"


def _fires(cron: str, tz: str, start: datetime, n: int) -> list[datetime]:
    out, t = [], start
    for _ in range(n):
        t = next_after(cron, tz, t)
        out.append(t)
    return out


def test_spring_forward_fires_once_right_after_the_gap() -> None:
    """Berlin skips 02:00-03:00 on 2026-03-29: the 02:30 fire happens at 03:30 CEST that day."""
    fires = _fires("30 2 * * *", BERLIN, datetime(2026, 3, 27, 12, tzinfo=UTC), 4)
    assert fires == [datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
                     datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # 03:30 CEST, after the gap
                     datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
                     datetime(2026, 3, 31, 0, 30, tzinfo=UTC)]


def test_fall_back_fires_a_repeated_time_once() -> None:
    """Berlin repeats 02:00-03:00 on 2026-10-25: 02:30 fires at its first occurrence only."""
    fires = _fires("30 2 * * *", BERLIN, datetime(2026, 10, 24, 12, tzinfo=UTC), 3)
    assert fires == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST
                     datetime(2026, 10, 26, 1, 30, tzinfo=UTC),  # 02:30 CET
                     datetime(2026, 10, 27, 1, 30, tzinfo=UTC)]


def test_local_time_stays_put_across_the_change() -> None:
    fires = _fires("0 9 * * 1", "America/New_York", datetime(2026, 10, 26, tzinfo=UTC), 2)
    assert [f.hour for f in fires] == [13, 14]  # 09:00 EDT, then 09:00 EST


def test_due_collapses_missed_fires() -> None:
    first = datetime(2026, 1, 1, 3, tzinfo=UTC)
    latest, missed = due("0 3 * * *", "UTC", first, first + timedelta(days=3, hours=1))
    assert latest == datetime(2026, 1, 4, 3, tzinfo=UTC) and missed == 3


LONG_CRON = ",".join(map(str, range(60))) + " * * * *"  # every minute, spelled out: 177 characters


@pytest.mark.parametrize("cron, tz, needle", [
    ("0 25 * * *", "UTC", "invalid cron expression '0 25 * * *'"),
    ("every day", "UTC", "invalid cron expression"),
    ("0 0 3 * * *", "UTC", "invalid cron expression '0 0 3 * * *': expected five fields (minute hour "
     "day-of-month month day-of-week), got 6"),  # croniter alone takes a seconds field
    ("0 3 * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
    (LONG_CRON, "UTC", f"cron expression of {len(LONG_CRON)} characters: at most 128"),  # valid,
])  # but wider than the column: a 500 on PostgreSQL
def test_bad_cron_or_zone(cron: str, tz: str, needle: str) -> None:
    with pytest.raises(CronError, match=re.escape(needle)):
        check(cron, tz)


def test_an_instant_in_the_repeated_hour_gets_the_next_days_fire() -> None:
    """At 02:10 CET, in Berlin's second 02:00-03:00 of 2026-10-25, today's 02:30 fired at its first
    occurrence (00:30 UTC): the next fire is tomorrow's, never a time before the instant asked."""
    assert next_after("30 2 * * *", BERLIN, datetime(2026, 10, 25, 1, 10, tzinfo=UTC)) == \
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC)


@pytest.mark.parametrize(("tz", "night"), [
    (BERLIN, datetime(2026, 10, 24, 22, tzinfo=UTC)), (BERLIN, datetime(2026, 3, 28, 22, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 11, 1, 3, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2026, 4, 4, 13, tzinfo=UTC)),  # a half-hour change
])
def test_every_instant_across_a_change_gets_a_later_fire_in_order(tz: str, night: datetime) -> None:
    for cron in ("30 2 * * *", "*/20 1-3 * * *", "0 * * * *"):
        earlier = None
        for step in range(0, 6 * 60, 5):  # every 5 minutes of the six hours around the change
            t = night + timedelta(minutes=step)
            fire = next_after(cron, tz, t)
            assert t < fire <= t + timedelta(days=1, hours=1), (cron, t, fire)
            assert earlier is None or fire >= earlier, (cron, t, fire, earlier)
            earlier = fire
