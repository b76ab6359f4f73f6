"""Schedules, their fires, and the inputs an inference schedule's fires scored."""

from __future__ import annotations

from datetime import datetime
from typing import NotRequired, TypedDict

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from mxq.db.schema.base import NEVER_REUSE_IDS, Base, utcnow
from mxq.json_types import JsonObject


class StoredPolicy(TypedDict):
    """A schedule's promotion policy as its fire keeps it."""

    promote: str
    metric: str
    min_gain: float
    min_metric: NotRequired[float | None]  # none before migration 0026


class Schedule(Base):
    """A recurring training job: when (cron in a time zone), what (a training spec), and how
    its result may replace the promoted model."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    cron: Mapped[str] = mapped_column(String(128))
    tz: Mapped[str] = mapped_column(String(64))
    spec: Mapped[JsonObject] = mapped_column(default=dict)  # training params, dataset aside
    dataset: Mapped[str] = mapped_column(Text)  # a path, folder or glob inside the data root
    promote: Mapped[str] = mapped_column(String(16))  # always | if-better | never
    metric: Mapped[str] = mapped_column(String(64))
    min_gain: Mapped[float] = mapped_column(Float, default=0.0)
    min_metric: Mapped[float | None] = mapped_column(Float)  # the promotion floor (migration 0026)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    next_fire_at: Mapped[datetime]
    last_fire_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    owner: Mapped[str | None] = mapped_column(String(128))  # who added it; its fires' jobs are theirs
    priority: Mapped[str] = mapped_column(String(8), default="normal")  # its fires' jobs'
    preemptible: Mapped[bool | None] = mapped_column(Boolean)  # its fires' jobs' (None: by priority)
    team: Mapped[str | None] = mapped_column(String(64))  # its fires' jobs are shared with it
    # `train`, or `infer`: `spec` is an inference request less its input, `dataset` the input glob
    # or prefix whose new files each fire scores once (migration 0031).
    kind: Mapped[str] = mapped_column(String(8), default="train", server_default="train")
    # An inference schedule following the promoted version fires when another is promoted, its
    # jobs at this level (None: only at its times); the version its newest fire scored with.
    rescore: Mapped[str | None] = mapped_column(String(8))
    followed_version: Mapped[int | None]

    __table_args__ = (Index("ix_schedules_due", "enabled", "next_fire_at"), NEVER_REUSE_IDS)


class Fire(Base):
    """One firing of a schedule, recorded once per (schedule, fire time).

    It keeps what its job needs to describe itself (the schedule's name and promotion policy
    when it fired): a removed schedule leaves its fires, with `schedule_id` None, as history."""

    __tablename__ = "schedule_fires"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    schedule_name: Mapped[str | None] = mapped_column(String(128))
    # {"promote", "metric", "min_gain", "min_metric"} as the schedule had them when it fired.
    policy: Mapped[StoredPolicy | None] = mapped_column(JSON, nullable=True)
    fire_time: Mapped[datetime]
    fired_at: Mapped[datetime] = mapped_column(default=utcnow)
    manual: Mapped[bool] = mapped_column(Boolean, default=False)
    missed: Mapped[int] = mapped_column(Integer, default=0)  # fires collapsed into this catch-up
    dataset_file: Mapped[str | None] = mapped_column(Text)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    error: Mapped[str | None] = mapped_column(Text)
    promotion: Mapped[JsonObject | None] = mapped_column(JSON)
    owner: Mapped[str | None] = mapped_column(String(128))  # the schedule's owner when it fired
    # An inference fire: how many files it submitted (None while it submits), and the version
    # whose promotion made it, if one did (migration 0031).
    scored: Mapped[int | None]
    rescore_version: Mapped[int | None]

    __table_args__ = (UniqueConstraint("schedule_id", "fire_time", name="uq_fires_schedule_time"),
                      NEVER_REUSE_IDS)


class ScoredInput(Base):
    """Bytes a model version scored for an inference schedule, once per schedule: unique per
    (schedule, model, version, identity), so no schedule blocks, delays or reveals another's
    (migration 0035), the identity being the bytes' (a local file's size and SHA-256, an
    object's size and ETag), so a file rewritten is new and a file renamed is not. The row is
    claimed before its job is submitted (with an idempotency key made from it), so a fire that
    dies between the two is finished by the next without a second job."""

    __tablename__ = "scored_inputs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[int]
    identity: Mapped[str] = mapped_column(String(256))
    location: Mapped[str] = mapped_column(Text)  # where the bytes were last seen
    size: Mapped[int] = mapped_column(BigInteger)
    mtime_ns: Mapped[int | None] = mapped_column(BigInteger)  # a local file's, at that sighting
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    fire_id: Mapped[int | None] = mapped_column(ForeignKey("schedule_fires.id"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    error: Mapped[str | None] = mapped_column(Text)  # the submit refused it (once: not retried)
    claimed_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("schedule_id", "model", "version", "identity",
                                       name="uq_scored_inputs_schedule_identity"),
                      Index("ix_scored_inputs_location", "schedule_id", "model", "version", "location"),
                      NEVER_REUSE_IDS)
