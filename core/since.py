"""`--since` and `?since=`: an age (`45s`, `30m`, `2h`, `1d`) or an ISO date/time, as one
instant. The CLI and the HTTP API read it the same way."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from mxq.errors import UserError

_AGO = re.compile(r"^(\d{1,9})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class SinceError(UserError):
    """A since that is neither an age nor an ISO time."""


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
