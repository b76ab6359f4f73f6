"""A job and what it records as it runs: its events, log lines, throughput points, epochs and predictions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.types import LargeBinary

from mxq.db.schema.base import NEVER_REUSE_IDS, Base, utcnow
from mxq.json_types import JsonObject
from mxq.status import JobStatus


class Job(Base):
    """One unit of work and everything recorded about it."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    # The kind's parameters, read by key (typed by mxq.workers.jobs.jobspecs where they are made).
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    requested_device: Mapped[str] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(128))
    node: Mapped[str | None] = mapped_column(String(64))
    device: Mapped[str | None] = mapped_column(String(32))
    worker: Mapped[str | None] = mapped_column(String(128))
    submitted_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]  # the last attempt's start: each claim moves it
    # The first attempt's start, kept by the claims after it (migration 0028): a job's
    # --time-limit counts from here (a chunk's and a node's part's from their parent's).
    first_started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # Refreshed by the worker while it runs the job: a stale value means the worker is gone.
    heartbeat_at: Mapped[datetime | None]
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    # When a running job last reported progress (or started): none for MXQ_STALL_SECONDS and the
    # reconciler fails it, although its worker's heartbeat is fresh (a read blocked for good).
    progress_at: Mapped[datetime | None]
    samples: Mapped[int | None]
    seconds: Mapped[float | None] = mapped_column(Float)
    samples_per_sec: Mapped[float | None] = mapped_column(Float)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the kind's result, read by key
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # A large job fans out into chunk jobs: the parent holds `chunks`, each child its index.
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    chunk_index: Mapped[int | None]
    chunks: Mapped[int | None]
    # The devices a multi-device job holds, e.g. ["cpu:0", "cpu:1"].
    devices: Mapped[list[str] | None] = mapped_column(JSON)
    # Set by a cancel of a running job; the job stops at its next batch or epoch boundary.
    cancel_requested_at: Mapped[datetime | None]
    # Inference: the sample index before which every result of this job (or chunk) is stored.
    # It moves in the transaction that stores the results, so a later attempt resumes here.
    committed: Mapped[int | None]
    # A submit's idempotency key (API header `Idempotency-Key`): a retry returns this job.
    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    # Who submitted it (mxq.users): a user's name, `local:<login>`; None before migration 0018.
    owner: Mapped[str | None] = mapped_column(String(128))
    # The team it was shared with (migration 0023): its members read its results; None: its
    # owner alone (and admins).
    team: Mapped[str | None] = mapped_column(String(64))
    # Which job a worker takes first (mxq.priorities: high, normal, low), and whether this one
    # may be made to yield to a waiting job of a higher level (migration 0019).
    priority: Mapped[str] = mapped_column(String(8), default="normal")
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)
    # Preemption: how often it yielded (not counted as attempts), the waiting job it was asked to
    # yield to (cleared when it does), and every job it yielded to (never twice to the same).
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    # How often an attempt stopped on a device fault (a CUDA error, a lost provider) and the job
    # went back to its queue: not counted as attempts either (migration 0025).
    device_faults: Mapped[int] = mapped_column(Integer, default=0)
    preempt_for: Mapped[int | None]
    preempted_by: Mapped[list[int] | None] = mapped_column(JSON)
    # Fair shares (migration 0020): a queued job not yet handed to the broker; the admitter
    # (mxq.workers.jobs.admit) publishes it when its owner's quota and share allow.
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    # Admitted beyond its owner's quota onto an idle device (MXQ_QUOTA_BORROWING): preemptible,
    # and the first taken back.
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    # Retention (migration 0024): a pinned job's output is never removed by the policy; when
    # the policy removed an output (MXQ_KEEP_OUTPUT_DAYS), the record stays and says when.
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    output_removed_at: Mapped[datetime | None]
    # Dependencies (migration 0032): the jobs it waits for (`--after`, a list of ids), and
    # whether it still does (`awaiting`, with `held`: nothing publishes it until the dependency
    # pass, mxq.workers.jobs.dependencies, clears it once they all succeeded, or fails it).
    after: Mapped[list[int] | None] = mapped_column(JSON)
    awaiting: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    __table_args__ = (
        Index("ix_jobs_owner_submitted", "owner", "submitted_at"),
        Index("ix_jobs_status_finished", "status", "finished_at"),  # retention's look
        Index("ix_jobs_held", "held", "status"),  # the admitter's look: the few held ones
        Index("ix_jobs_awaiting", "awaiting", "status"),  # the dependency pass's look
        Index("ix_jobs_parent", "parent_id"),
        Index("ux_jobs_owner_idempotency_key", "owner", "idempotency_key", unique=True),
        Index("ix_jobs_status_submitted", "status", "submitted_at"),
        Index("ix_jobs_kind_submitted", "kind", "submitted_at"),
        Index("ix_jobs_device_submitted", "device", "submitted_at"),
        Index("ix_jobs_node_submitted", "node", "submitted_at"),
        Index("ix_jobs_submitted", "submitted_at"),
        Index("ix_jobs_worker_status", "worker", "status"),
        Index("ix_jobs_status_queue", "status", "queue"),  # the device table's counts per queue
        NEVER_REUSE_IDS,
    )


class JobEvent(Base):
    """Something that happened to a job outside its normal run: a requeue by the reconciler or
    after a worker death, a retry, an out-of-memory batch split. Shown with the job."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[JsonObject] = mapped_column(default=dict)

    __table_args__ = (Index("ix_job_events_job", "job_id", "id"), NEVER_REUSE_IDS)


class JobLogLine(Base):
    """One line a job printed: its training child's stdout or stderr (`child`), its worker's log
    records while it ran (`worker`), or mxq's own note (`mxq`: an attempt's start and end, how
    many lines were dropped). Numbered per job (`seq`); bounded per job (`db/outputs/logs.py`)."""

    __tablename__ = "job_logs"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    source: Mapped[str] = mapped_column(String(8))
    text: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(Integer)  # its UTF-8 bytes and its newline


class JobMetric(Base):
    """Throughput over time: one point per flushed stretch of work (or per epoch)."""

    __tablename__ = "job_metrics"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    device: Mapped[str | None] = mapped_column(String(32))
    samples: Mapped[int]
    seconds: Mapped[float] = mapped_column(Float)
    samples_per_sec: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_job_metrics_at", "at"),)  # recent points: the device table's rates


class Epoch(Base):
    """One finished training epoch: loss, accuracy, throughput, and its checkpoint."""

    __tablename__ = "epochs"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    train_loss: Mapped[float] = mapped_column(Float)
    train_accuracy: Mapped[float] = mapped_column(Float)
    val_accuracy: Mapped[float | None] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)
    samples_per_sec: Mapped[float] = mapped_column(Float)
    per_device: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    checkpoint: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class Prediction(Base):
    """A run of one job's consecutive samples' results, keyed by (job, first sample): a read's
    samples as packed arrays (`mxq.db.outputs.blocks` says how, and why not a row a sample)."""

    __tablename__ = "predictions"

    # no foreign key: its check per row bounded COPY (migration 0037 says why none is needed)
    job_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    first_index: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    samples: Mapped[int] = mapped_column(Integer)
    classes: Mapped[bytes] = mapped_column(LargeBinary)  # int32, little-endian, one a sample
    scores: Mapped[bytes] = mapped_column(LargeBinary)  # float32, little-endian, one a sample
    top_k: Mapped[str | None] = mapped_column(Text)  # JSON: a list, one entry a sample
