"""Cron times in a schedule's own time zone, stepping in local wall-clock time; or a polling
interval, `@every DURATION` (`--every 10m` is stored as `@every 10m`), as Go's cron writes it.

Each wall-clock time fires once: a time that does not exist (the hour skipped when clocks go
forward) fires right after the change, a time that happens twice (clocks go back) fires at its
first occurrence. An interval fires that long after its last fire: polls missed while down are
not caught up one by one (one fire looks at everything that landed meanwhile).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from mxq.errors import UserError
from mxq.since import DurationError, format_duration, parse_duration

EVERY = "@every "
MIN_EVERY_SECONDS = 10  # a poll more often than this would only load the data root or the bucket
MAX_EVERY_SECONDS = 366 * 86400
# Fires older than this many are not listed one by one when catching up after downtime.
MAX_LISTED_MISSES = 100_000


class CronError(UserError):
    """An invalid cron expression or an unknown time zone."""


def zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {tz!r}: use an IANA name such as UTC or "
                        "Europe/Berlin") from None


# The longest cron expression a schedule keeps (the width of `schedules.cron`): a longer one,
# valid to croniter, was a 500 on PostgreSQL.
MAX_CRON_CHARS = 128

def every(duration: str) -> str:
    """`--every DURATION` as the schedule stores it (`@every 10m`), or CronError saying what is
    allowed."""
    try:
        seconds = parse_duration(duration.strip(), "--every")
    except DurationError as exc:
        raise CronError(str(exc)) from None
    if not MIN_EVERY_SECONDS <= seconds <= MAX_EVERY_SECONDS:
        raise CronError(f"--every {duration}: give {format_duration(MIN_EVERY_SECONDS)} to "
                        f"{format_duration(MAX_EVERY_SECONDS)}")
    return EVERY + format_duration(seconds)


def interval(cron: str) -> timedelta | None:
    """An `@every` schedule's interval (None for a cron expression)."""
    if not cron.startswith(EVERY):
        return None
    return timedelta(seconds=parse_duration(cron[len(EVERY):], "--every"))


def check(cron: str, tz: str) -> None:
    if cron.startswith(EVERY):
        every(cron[len(EVERY):])
        zone(tz)
        return
    if len(cron) > MAX_CRON_CHARS:
        raise CronError(f"cron expression of {len(cron)} characters: at most {MAX_CRON_CHARS} are "
                        "allowed (five fields, e.g. '0 3 * * *')")
    # croniter also takes a sixth (seconds) field and a seventh (year): only five are allowed.
    fields = len(cron.split())
    if fields != 5 or not croniter.is_valid(cron):
        got = f", got {fields}" if fields != 5 else ""
        raise CronError(f"invalid cron expression {cron!r}: expected five fields "
                        f"(minute hour day-of-month month day-of-week){got}, e.g. '0 3 * * *'")
    zone(tz)
    try:  # croniter searches some years ahead for a date such as February 30, then gives up
        _next(cron, datetime(2000, 1, 1))
    except CroniterBadDateError:
        raise CronError(f"cron expression {cron!r} names no date that ever comes (such as "
                        "February 30): it would never fire") from None


def _next(cron: str, start: datetime) -> datetime:
    found: datetime = croniter(cron, start).get_next(datetime)
    return found


def next_after(cron: str, tz: str, after: datetime) -> datetime:
    """The first fire strictly after the instant `after`, as a UTC instant."""
    if (step := interval(cron)) is not None:
        return after + step
    z = zone(tz)
    local = after.astimezone(z).replace(tzinfo=None)
    candidate = _next(cron, local)
    fire = candidate.replace(tzinfo=z, fold=0).astimezone(UTC)
    # A wall time the clock shows twice (the hour repeated when summer time ends) is mapped to its
    # first occurrence (fold=0), which lies before `after` when `after` is in the second one: that
    # fire is past (a repeated time fires once), so step on to the next. (A time in a spring gap
    # maps forward, past the gap, never back.)
    while fire <= after:
        candidate = _next(cron, candidate)
        fire = candidate.replace(tzinfo=z, fold=0).astimezone(UTC)
    return fire


def due(cron: str, tz: str, first: datetime, now: datetime) -> tuple[datetime, int]:
    """The latest fire time in [first, now] and how many earlier ones it stands for (an
    interval's polls are not counted: the one fire looks at all that landed)."""
    if interval(cron) is not None:
        return first, 0
    latest, missed = first, 0
    while missed < MAX_LISTED_MISSES:
        following = next_after(cron, tz, latest)
        if following > now:
            break
        latest, missed = following, missed + 1
    return latest, missed
