"""Times users write: `--since` and `?since=` (an age, `45s`, `30m`, `2h`, `1d`, or an ISO
date/time, as one instant), and durations (`--time-limit 90s`, `1h30m`, plain seconds). The
CLI and the HTTP API read them the same way."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from mxq.errors import UserError

_AGO = re.compile(r"^(\d{1,9})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
# A duration: whole seconds, or amounts of d, h, m, s in that order, each at most once (1h30m).
DURATION_PATTERN = r"^(?:[0-9]{1,9}|(?:[0-9]{1,9}d)?(?:[0-9]{1,9}h)?(?:[0-9]{1,9}m)?(?:[0-9]{1,9}s)?)$"
_DURATION = re.compile(DURATION_PATTERN)
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
DURATION_EXAMPLES = "a duration such as 90s, 45m, 2h or 1h30m (or whole seconds)"


class SinceError(UserError):
    """A since that is neither an age nor an ISO time."""


# A job's --time-limit as the API's schema states it, so that every value the schema allows is
# accepted: a duration that is not zero, whole seconds of at most 9 digits or amounts of at most 4
# digits each. The largest value either form can name is under MAX_TIME_LIMIT (9999d9999h9999m9999s
# is 900,519,939 s), so the bound never refuses what the pattern allows.
TIME_LIMIT_PATTERN = (r"^(?=.*[1-9])(?:[0-9]{1,9}|"
                      r"(?:[0-9]{1,4}d)?(?:[0-9]{1,4}h)?(?:[0-9]{1,4}m)?(?:[0-9]{1,4}s)?)$")
MAX_TIME_LIMIT = 999_999_999  # seconds: about 31 years, the API's and the CLI's
TIME_LIMIT_EXAMPLES = ("a duration of at least 1s, such as 90s, 45m, 2h or 1h30m (each amount at "
                       "most 4 digits), or whole seconds (at most 9 digits)")


class DurationError(UserError):
    """A duration that is not one (`5x`, `1.5h`, `30m2h`, empty)."""


def parse_since(text: str, now: datetime) -> datetime:
    """The instant `text` names: an age before `now`, or an ISO time (UTC when it names no zone)."""
    if m := _AGO.match(text.strip()):
        try:
            return now - timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
        except OverflowError:
            raise SinceError(f"since {text!r} reaches before the year 1") from None
    try:
        ts = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SinceError(f"since {text!r}: use an age such as 30m, 2h, 1d or an ISO time such as "
                         "2026-11-30T08:00") from None
    return ts if ts.tzinfo else ts.replace(tzinfo=now.tzinfo)


def parse_duration(text: str, name: str = "duration") -> int:
    """The seconds `text` names: `90`, `90s`, `45m`, `2h`, `1h30m`, `1d12h`; DurationError naming
    `name` (the option or field), the value and what is allowed when it is none."""
    if not text or not _DURATION.fullmatch(text):  # exactly what the API's schema allows
        raise DurationError(f"{name} {text!r}: expected {DURATION_EXAMPLES}")
    if text.isdecimal():
        return int(text)
    return sum(int(amount) * _SECONDS[unit] for amount, unit in re.findall(r"(\d+)([dhms])", text))


def parse_time_limit(text: str, name: str = "time limit") -> int:
    """A time limit's seconds: what TIME_LIMIT_PATTERN allows (so the CLI refuses what the API's
    schema refuses), DurationError naming `name`, the value and what is allowed otherwise."""
    if not re.fullmatch(TIME_LIMIT_PATTERN, text):
        raise DurationError(f"{name} {text!r}: expected {TIME_LIMIT_EXAMPLES}")
    return parse_duration(text, name)


def format_duration(seconds: int) -> str:
    """`seconds` as the shortest duration `parse_duration` reads back: 90 is `1m30s`, 7200 `2h`."""
    if seconds <= 0:
        return "0s"
    parts, rest = [], seconds
    for unit, size in _SECONDS.items():
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)
