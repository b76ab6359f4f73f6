"""Webhook endpoints and their deliveries (the outbox)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from mxq.db.schema.base import NEVER_REUSE_IDS, Base, utcnow
from mxq.json_types import JsonObject


class Hook(Base):
    """A webhook endpoint (`mxq hooks add`, migration 0033): where the events it names are
    POSTed, signed with its secret. The secret is kept so that the sender can sign; no record
    mxq hands out (the API, `mxq hooks ls`, a log line, /metrics) carries it."""

    __tablename__ = "hooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str | None] = mapped_column(String(128))  # the admin who added it
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (NEVER_REUSE_IDS,)


class HookDelivery(Base):
    """One event for one endpoint: the outbox row written with the change it reports, sent by
    the schedule process (`mxq.workers.webhooks.sender`). `id` is the delivery id the receiver
    sees (`dlv_…`), the same on every attempt and a redelivery by hand."""

    __tablename__ = "hook_deliveries"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    hook_id: Mapped[int] = mapped_column(ForeignKey("hooks.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))
    payload: Mapped[JsonObject] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|delivered|failed|gave_up
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the next attempt is due; a claimed attempt moves it past its send (a lease), so a
    # sender that died mid-send leaves the delivery to be tried again.
    next_attempt_at: Mapped[datetime]
    expires_at: Mapped[datetime]  # no retry after this (a day after the event or a redelivery)
    last_code: Mapped[int | None]  # the HTTP status of the last answer (None: none came)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_hook_deliveries_due", "status", "next_attempt_at"),
                      Index("ix_hook_deliveries_hook", "hook_id", "created_at"))
