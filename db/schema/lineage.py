"""What the OpenLineage export has sent."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, Text
from sqlalchemy.orm import Mapped, mapped_column

from mxq.db.schema.base import Base, utcnow


class OpenLineageRun(Base):
    """Which OpenLineage events of a job the export has sent (migration 0036): the jobs table is
    its outbox (`mxq.db.lineage.openlineage`), so an event is sent after a crash as before it, and a row
    here only says START and the end (COMPLETE, FAIL or ABORT) went, or why the last try did not."""

    __tablename__ = "openlineage_runs"

    job_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    started_sent_at: Mapped[datetime | None]
    ended_sent_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # failed tries since the last send
    next_attempt_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)


class OpenLineageCursor(Base):
    """The export's one row: jobs below `low_job_id` need nothing more (sent, or before the export
    was turned on: it starts with the jobs submitted after, never with the whole history)."""

    __tablename__ = "openlineage_cursor"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    low_job_id: Mapped[int] = mapped_column(Integer)
    enabled_at: Mapped[datetime] = mapped_column(default=utcnow)
