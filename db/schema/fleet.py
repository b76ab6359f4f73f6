"""The stack a database belongs to, and the heartbeats of its worker processes (one per device)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from mxq.db.schema.base import Base, utcnow
from mxq.json_types import JsonObject


class StackRow(Base):
    """The stack this database belongs to: one row, made by migration 0015. Files a stack keeps
    under its home are keyed by this id, so a home reused with another database never serves
    the old one's files."""

    __tablename__ = "stack"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WorkerBeat(Base):
    """The last heartbeat of the worker process pinned to one device."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)  # cpu1@box1
    node: Mapped[str] = mapped_column(String(64))
    device: Mapped[str] = mapped_column(String(32))  # cpu:1
    queue: Mapped[str] = mapped_column(String(128))
    pid: Mapped[int | None]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime | None]  # None: stopped or known dead
    current_job: Mapped[int | None]
    info: Mapped[JsonObject] = mapped_column(default=dict)
    # The engines its device runs ("mxnet,onnx"; None: not said, taken as both): routing's filter.
    engines: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (Index("ix_workers_node_device", "node", "device"),)
