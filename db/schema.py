"""The tables: jobs and the heartbeats of worker processes (one per device)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, overload

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from mxq.status import JobStatus


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
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: JSON}


class Job(Base):
    """One unit of work and everything recorded about it."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
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
    result: Mapped[dict[str, Any] | None]
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


class StackRow(Base):
    """The stack this database belongs to: one row, made by migration 0015. Files a stack keeps
    under its home are keyed by this id, so a home reused with another database never serves
    the old one's files."""

    __tablename__ = "stack"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobEvent(Base):
    """Something that happened to a job outside its normal run: a requeue by the reconciler or
    after a worker death, a retry, an out-of-memory batch split. Shown with the job."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)

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
    info: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The engines its device runs ("mxnet,onnx"; None: not said, taken as both): routing's filter.
    engines: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (Index("ix_workers_node_device", "node", "device"),)


class Model(Base):
    """One version of a named model in the store (`$MXQ_HOME/models/NAME/VERSION/`)."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int]
    arch: Mapped[str] = mapped_column(String(64))  # a built-in architecture, or "symbol"
    input_shape: Mapped[list[int]] = mapped_column(JSON)
    classes: Mapped[int]
    params_file: Mapped[str] = mapped_column(Text)
    symbol_file: Mapped[str | None] = mapped_column(Text)
    checksum: Mapped[str] = mapped_column(String(64))  # sha256 of the params file
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    source: Mapped[str] = mapped_column(String(256))
    promoted: Mapped[bool] = mapped_column(Boolean, default=False)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The ONNX export: {"file", "max_diff", "argmax_agreement"} or {"file": None, "error"}.
    onnx: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    # Measured samples/s per device kind: {"cpu": {"mxnet": 4100.0, "onnx": 15800.0}}.
    engines: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    # How inputs are scaled before the model sees them: {"scale", "mean", "std", "layout"}.
    preprocess: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    # What the model outputs: "logits" (mxq applies a softmax) or "probabilities" (used as is).
    outputs: Mapped[str] = mapped_column(String(16), default="logits", server_default="logits")
    # Lower-precision builds of the ONNX export and how they agree with it (`mxq models
    # quantize`): {"int8": {"file", "sha256", "agreement", "max_diff", "accuracy", ...}}.
    variants: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    # Several outputs (migration 0030): [{"name", "kind", "width"}, ...] in order; `outputs` is
    # then "heads" and `classes` the widths' sum. NULL for one output.
    heads: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # Who may register and promote its versions (migration 0023): its owner (a user's name),
    # the members of `team`, admins; a model without an owner is the admins' alone.
    owner: Mapped[str | None] = mapped_column(String(128))
    team: Mapped[str | None] = mapped_column(String(64))
    # When the retention policy removed this unpromoted version's files (MXQ_KEEP_VERSIONS);
    # the row stays, so the history still names it (migration 0024).
    removed_at: Mapped[datetime | None]

    __table_args__ = (UniqueConstraint("name", "version", name="uq_models_name_version"),
                      NEVER_REUSE_IDS)


class Arch(Base):
    """One version of an architecture's code (`mxq arch add`, migration 0029): its file, stored
    by content (`$MXQ_HOME/models/STACK/.archs/SHA256.py`, and the bucket store), and the
    factory that builds its net; a training of NAME pins the newest version's checksum."""

    __tablename__ = "archs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int]
    sha256: Mapped[str] = mapped_column(String(64))
    factory: Mapped[str] = mapped_column(String(128))
    file_name: Mapped[str] = mapped_column(String(256))
    # What the trial forward at registration built it for.
    classes: Mapped[int]
    input_shape: Mapped[list[int]] = mapped_column(JSON)
    added_by: Mapped[str | None] = mapped_column(String(128))
    added_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("name", "version", name="uq_archs_name_version"),
                      NEVER_REUSE_IDS)


class Prediction(Base):
    """One sample's result; keyed by (job, index) so a redelivered chunk cannot duplicate it."""

    __tablename__ = "predictions"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    predicted_class: Mapped[int]
    score: Mapped[float] = mapped_column(Float)
    top_k: Mapped[list[Any] | None] = mapped_column(JSON)


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
    per_device: Mapped[dict[str, Any]] = mapped_column(default=dict)
    checkpoint: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class Schedule(Base):
    """A recurring training job: when (cron in a time zone), what (a training spec), and how
    its result may replace the promoted model."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    cron: Mapped[str] = mapped_column(String(128))
    tz: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)  # training params, dataset aside
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
    policy: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    fire_time: Mapped[datetime]
    fired_at: Mapped[datetime] = mapped_column(default=utcnow)
    manual: Mapped[bool] = mapped_column(Boolean, default=False)
    missed: Mapped[int] = mapped_column(Integer, default=0)  # fires collapsed into this catch-up
    dataset_file: Mapped[str | None] = mapped_column(Text)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    error: Mapped[str | None] = mapped_column(Text)
    promotion: Mapped[dict[str, Any] | None] = mapped_column(JSON)
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


class User(Base):
    """A user of the API (mxq.users): a role and the scrypt hash of one token, never the token.

    `token_id` (the clear part of `mxq_<id>_<secret>`) finds the row; the `admin` row made by
    migration 0018 has none: MXQ_API_TOKEN, when set, is its token."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    token_id: Mapped[str | None] = mapped_column(String(12), unique=True)
    token_hash: Mapped[str | None] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Its fair share (mxq.shares, migration 0020): a weight against the other owners' when
    # devices are contended, and at most this many devices at once (None: no quota).
    share: Mapped[float] = mapped_column(Float, default=1.0)
    max_devices: Mapped[int | None]
    # Removed (migration 0023): the row stays, without a token, so that its name is never given
    # to another user and what it owned stays its own.
    removed_at: Mapped[datetime | None]


class Team(Base):
    """A team (mxq.users): what is shared with it is read by its members."""

    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TeamMember(Base):
    """One user in one team; a user belongs to several."""

    __tablename__ = "team_members"

    team: Mapped[str] = mapped_column(ForeignKey("teams.name", ondelete="CASCADE"), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"), primary_key=True)

    __table_args__ = (Index("ix_team_members_user", "user"),)


class LoginSession(Base):
    """A dashboard login: a token exchanged for a cookie. Only the cookie's SHA-256 is kept, with
    the CSRF token its writes must carry."""

    __tablename__ = "sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


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
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
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
