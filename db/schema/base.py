"""What every table shares: the declarative base, and times as stored (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

from sqlalchemy import JSON, DateTime
from sqlalchemy.orm import DeclarativeBase

from mxq.json_types import JsonObject


def utcnow() -> datetime:
    return datetime.now(UTC)


@overload
def as_utc(ts: datetime) -> datetime: ...
@overload
def as_utc(ts: None) -> None: ...
@overload
def as_utc(ts: datetime | None) -> datetime | None: ...
def as_utc(ts: datetime | None) -> datetime | None:
    """SQLite hands datetimes back without a zone; all of ours are UTC."""
    return ts if ts is None or ts.tzinfo else ts.replace(tzinfo=UTC)


def iso(ts: datetime | None) -> str | None:
    """A stored time as ISO 8601 with its UTC offset (None stays None)."""
    return None if ts is None else as_utc(ts).isoformat()


# Tables whose ids history refers to: on SQLite an id is then never handed out twice, even after
# the row holding the largest one is deleted (migration 0010; PostgreSQL's sequences never reuse).
NEVER_REUSE_IDS = {"sqlite_autoincrement": True}


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), JsonObject: JSON}
