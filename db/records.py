"""The records `mxq.db` hands to the other layers, typed: what a caller may read from them.

Most are also JSON shapes users and scripts rely on (`mxq job ID --json`, the API), so a key is
added, never renamed or dropped; the few read only inside mxq (times as datetimes) say so.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NotRequired

# pydantic (the API's answers) reads TypedDicts from typing_extensions only, on Python 3.11
from typing_extensions import TypedDict

from mxq.json_types import JsonObject
from mxq.status import DeliveryStatus, JobKind, JobStatus

# The records the API answers with keep their free-form JSON `dict[str, Any]`: pydantic cannot
# build a schema of the recursive `mxq.json_types` aliases inside a TypedDict (class not fully
# defined). JobRow, read only inside mxq, is typed JSON.

# A device's health (`mxq.db.fleet.health`): its worker beats; its worker refused it (the device
# failed its start check or faulted during a job) and does not beat; or neither (stopped).
Health = Literal["healthy", "out", "offline"]


class WorkerRecord(TypedDict):
    """A device worker's row, `alive` decided by heartbeat age (`mxq.db.fleet.list_workers`)."""

    name: str
    node: str
    device: str  # its label on its node, e.g. "gpu:0"
    queue: str
    pid: int | None
    alive: bool
    heartbeat_age: float | None
    last_seen: str | None
    current_job: int | None
    info: dict[str, Any] | None  # Any: its readers take the device's figures out by name
    started_at: str | None  # when its process registered: a restart moves it
    engines: list[str]  # what its device runs: "mxnet", "onnx" (both when not said)
    health: Health  # "healthy" (alive), "out" (refused and not alive), "offline"
    out_reason: str | None  # why it is out (its worker's refusal); None unless out
    out_since: str | None  # when it went out (ISO 8601, UTC); None unless out (or not recorded)


class MetricPoint(TypedDict):
    """One throughput point of a job (or of one of its chunks)."""

    job_id: int
    step: int
    at: str | None
    device: str | None
    samples: int
    seconds: float
    samples_per_sec: float


class EpochResult(TypedDict):
    """What a training measured of one epoch (`mxq.tasks.training.train_loop.fit`); stored with
    its checkpoint and its time, it is an `EpochRecord`."""

    epoch: int
    train_loss: float
    train_accuracy: float
    val_accuracy: float | None
    seconds: float
    samples_per_sec: float
    per_device: dict[str, float]  # samples/s per device (cpu:0; cpu:0@node once nodes are merged)


class EpochRecord(EpochResult):
    """A stored epoch (`mxq.db.outputs.epochs`): its figures, its checkpoint, when it ended."""

    checkpoint: str | None
    at: str | None


class EventRecord(TypedDict):
    at: str | None
    kind: str
    message: str
    data: dict[str, Any] | None


class FirePolicy(TypedDict):
    """The schedule behind a fire, with its promotion policy (`mxq.db.schedules.fire_of`)."""

    schedule: str
    fire_time: str | None
    promote: str
    metric: str
    min_gain: float
    min_metric: float | None  # the promotion floor (None: none)
    removed: bool  # the schedule was removed since; the fire and its job are history


class JobRecord(TypedDict):
    """The stable JSON shape of one job (`mxq job ID --json`, `GET /api/v1/jobs/ID`)."""

    id: int
    kind: JobKind
    status: JobStatus
    params: dict[str, Any]  # free-form JSON, read by key (typed by mxq.workers.jobs.jobspecs)
    requested_device: str | None
    queue: str | None
    device: str | None
    node: str | None
    worker: str | None
    attempts: int
    progress: float | None
    samples: int | None
    seconds: float | None
    samples_per_sec: float | None
    submitted_at: str | None
    started_at: str | None
    finished_at: str | None
    result: dict[str, Any] | None  # Any: read by key (an arch job's is its ArchRecord)
    error: str | None
    parent_id: int | None
    chunk_index: int | None
    chunks: int | None
    model: str | None
    model_version: int | None
    output: str | None
    devices: list[str] | None
    owner: str | None  # who submitted it (mxq.users); None for a job from before users
    team: str | None  # the team its results are shared with; None: its owner alone (and admins)
    priority: str  # high, normal or low (mxq.priorities)
    preemptible: bool  # may yield at a checkpoint to a waiting job of a higher level
    preemptions: int  # how often it did (each a `preempted` event naming the job)
    device_faults: int  # how often its device failed mid-attempt (each a `device-fault` event)
    borrowed: bool  # admitted beyond its owner's quota onto an idle device: taken back first
    pinned: bool  # its owner keeps its output whatever the retention policy says (`mxq pin`)
    output_removed_at: str | None  # when the retention policy removed its output (`mxq gc`)
    after: list[int] | None  # the jobs it waits for, or waited for (`--after`); None: none
    # With `with_metrics` (one job's full view):
    metrics: NotRequired[list[MetricPoint]]
    events: NotRequired[list[EventRecord]]
    epochs: NotRequired[list[EpochRecord]]  # training only
    schedule: NotRequired[FirePolicy | None]  # training only


# What a version's one output is (`ModelRecord.outputs`), a (batch, width) float32 array whose
# width is the record's `classes`: class logits (mxq applies a softmax) or probabilities (the
# model ends in one); independent label probabilities (multi-label, each in [0, 1]); regression
# values; an embedding (any vector). Only the first two are a classifier's: argmax, scores, top-k.
CLASSIFIER_OUTPUTS = ("logits", "probabilities")
OUTPUT_KINDS = (*CLASSIFIER_OUTPUTS, "multilabel", "regression", "embedding")
# Kinds whose values SQL rows cannot hold (a row keeps a class, a score and top-k pairs): their
# jobs write .npy or Parquet.
VALUE_OUTPUTS = ("regression", "embedding")
# A version with several outputs (`ModelRecord.heads`) records `outputs` as this.
HEADS = "heads"


class Head(TypedDict):
    """One of a version's several outputs: its name (a file's and a column's), its kind (one
    of OUTPUT_KINDS) and its width; a job's row holds every output's side by side, in order."""

    name: str
    kind: str
    width: int


class ModelRecord(TypedDict):
    """One version of a model in the store (`mxq models NAME --json`)."""

    name: str
    version: int
    arch: str
    input_shape: list[int]
    classes: int
    params_file: str
    symbol_file: str | None
    checksum: str
    created_at: str | None
    source: str
    promoted: bool
    metrics: dict[str, Any]  # free-form JSON: the training's figures, read by name
    onnx: dict[str, Any] | None  # the ONNX export and its agreement with MXNet (Any: read by key)
    engines: dict[str, dict[str, float]]  # samples/s per device kind and engine
    auto_engine: dict[str, dict[str, str]]  # what `--engine auto` runs per kind, and why
    preprocess: dict[str, Any]  # how inputs are scaled for it (`mxq.preprocess`)
    outputs: str  # one of OUTPUT_KINDS: what the (batch, classes) output holds, `classes` its width
    variants: dict[str, dict[str, Any]]  # lower-precision builds and their checks (`mxq models quantize`)
    heads: NotRequired[list[Head] | None]  # several outputs, in order (`outputs` is then HEADS); None: one
    owner: str | None  # who may register and promote its versions, with `team`'s members;
    team: str | None  # None: the admins alone (a model from before sharing)
    removed_at: str | None  # when the retention policy removed its files (MXQ_KEEP_VERSIONS)


class ArchRecord(TypedDict):
    """One version of an architecture's code (`mxq arch ls --json`, `GET /archs`)."""

    name: str
    version: int
    sha256: str  # the file's checksum: where it is stored, and what a training pins
    factory: str  # the function of the file that builds the net
    file_name: str
    classes: int  # what the trial forward at registration built it for
    input_shape: list[int]
    added_by: str | None
    added_at: str | None


class JobRow(TypedDict):
    """A job as a worker reads it before it claims a delivery, the training child before it
    trains and a requeue before it publishes (`mxq.db.jobs.job_row`); inside mxq only."""

    id: int
    kind: JobKind
    status: JobStatus
    params: JsonObject  # free-form JSON: the kind's parameters (mxq.workers.jobs.jobspecs)
    queue: str
    requested_device: str
    parent_id: int | None
    heartbeat_at: datetime | None
    committed: int | None  # inference: where earlier attempts stopped storing results
    attempts: int
    worker: str | None  # the last attempt's
    priority: str  # its level (mxq.priorities)
    preemptions: int  # attempts that yielded to another job (not counted against the limit)
    device_faults: int  # attempts its device failed under (not counted against the limit either)
    clock_from: datetime | None  # its time limit counts from: its (or its parent's) first start


class QueuedJob(TypedDict):
    """A waiting job as the queue view shows it (`mxq.db.reports.queue.waiting`)."""

    id: int
    kind: JobKind
    owner: str | None
    priority: str
    preemptible: bool
    queue: str
    submitted_at: str | None
    started_before: bool  # an attempt ran (it was preempted, or its worker died): it goes first
    preemptions: int
    held: bool  # not handed to the broker yet: its owner's quota or fair share admits it later


class QueueEntry(QueuedJob):
    """A waiting job with its place in the queue and why it waits (`mxq queue`, `GET /queue`)."""

    position: int  # 1: the next one a worker takes (among the jobs its devices could run)
    why: str  # in words: what it waits for


class JobRoute(TypedDict):
    """Where a job's message goes: its task (`mxq.<kind>`), its queue, and its turn there: its
    priority level, and whether an attempt of it ran before (`mxq.db.repair`)."""

    kind: JobKind
    queue: str
    priority: str
    started: bool


class LostFire(TypedDict):
    """A schedule fire whose tick died before it submitted its job (`mxq.db.repair.lost_fires`)."""

    fire_id: int
    schedule: str  # the schedule's name


class PredictionRow(TypedDict):
    """One stored prediction, wherever the job stored it (`mxq.db.outputs.results.read`)."""

    index: int
    predicted_class: int
    score: float
    top_k: list[tuple[int, float]] | None  # [class, probability] pairs, best first


class LogLine(TypedDict):
    """One line of a job's log (`db/outputs/logs.py`)."""

    seq: int  # its number in the job's log, from 1 (a dropped line's number is never reused)
    at: str  # when it was written (ISO 8601, UTC)
    source: str  # worker (its worker's log records), child (its training child's output), mxq
    text: str


class LogPage(TypedDict):
    """A job's log lines after a number: `next` to ask after, `ended` once nothing more will come."""

    items: list[LogLine]
    next: int
    status: JobStatus  # the job's
    ended: bool


class ScheduleRecord(TypedDict):
    """One schedule (`mxq schedule list --json`, `GET /api/v1/schedules`)."""

    name: str
    cron: str
    tz: str
    spec: dict[str, Any]  # free-form JSON: the options each fire submits, as given (read by key)
    dataset: str
    promote: str
    metric: str
    min_gain: float
    min_metric: float | None  # the promotion floor: below it a version is kept, never promoted
    enabled: bool
    next_fire_at: str | None
    last_fire_at: str | None
    created_at: str | None
    owner: str | None  # who added it; the jobs its fires submit are theirs
    team: str | None  # the team its fires' jobs are shared with
    priority: str  # the level of its fires' jobs (mxq.priorities)
    preemptible: bool | None  # whether they may yield (None: as their level says)
    kind: JobKind  # train, or infer: `spec` is an inference request less its input (`dataset`)
    rescore: str | None  # infer: the level of the jobs a promotion's fire makes (None: none)
    followed_version: int | None  # infer: the version its newest fire scored with


class StoredSchedule(ScheduleRecord):
    """A schedule with the id its fires are made against (`mxq.db.schedules.get`); inside mxq only."""

    id: int


class DueSchedule(StoredSchedule):
    """A schedule with its next fire time as a datetime (`mxq.db.schedules.due`, `upcoming`)."""

    next: datetime


class FireRecord(TypedDict):
    """One fire of a schedule, with its job and its promotion decision (`mxq.db.schedules.fires`)."""

    fire_time: str | None
    fired_at: str | None
    manual: bool
    missed: int
    catch_up: bool
    dataset_file: str | None
    job_id: int | None
    job_status: str | None  # its job's status; without a job, skipped or failed (None: not yet)
    error: str | None
    promotion: dict[str, Any] | None  # free-form JSON, read by key: `mxq.promotion.decision_record`
    owner: str | None  # the schedule's owner when it fired: its job's owner
    scored: int | None  # an inference fire: the files it submitted (None while it submits)
    jobs: list[int]  # an inference fire's jobs, one per new file
    rescore_version: int | None  # the promoted version that made this fire, if one did


class ScheduleDetail(ScheduleRecord):
    """A schedule and its fires (`mxq schedule show --json`, `GET /api/v1/schedules/NAME`)."""

    fires: list[FireRecord]


# Webhooks (migration 0033): an endpoint as mxq shows it (never its secret, which only the
# answer to its creation carries, once), and one delivery of an event to it.
HOOK_EVENTS = ("job.finished", "job.failed", "version.registered", "version.promoted",
               "schedule.fire_failed", "device.out", "device.back")
DELIVERY_STATUSES = tuple(DeliveryStatus)


class HookRecord(TypedDict):
    id: int
    url: str
    events: list[str]
    owner: str | None
    enabled: bool
    created_at: str | None


class NewHook(HookRecord):
    secret: str  # shown once: what the receiver checks signatures with


class HookCreated(NewHook):
    standard_secret: str  # the same, as Standard Webhooks libraries take it: whsec_ + base64


class DeliveryRecord(TypedDict):
    id: str  # the delivery id the receiver sees (X-Mxq-Delivery), the same on every attempt
    hook_id: int
    event: str
    status: DeliveryStatus  # failed: retried at next_attempt_at
    attempts: int
    last_code: int | None
    last_error: str | None
    created_at: str | None
    next_attempt_at: str | None
    expires_at: str | None
    delivered_at: str | None
    payload: dict[str, Any]  # free-form JSON: the event's body, read by key


class LineageRecord(TypedDict):
    """What produced one inference job's output (`prediction_lineage`, `mxq lineage JOB`)."""

    job_id: int
    status: JobStatus
    owner: str | None
    team: str | None
    model: str | None
    model_version: int | None
    variant: str | None  # the precision that served it: fp32, int8, fp16 (None until it ran)
    engine: str | None  # mxnet or onnx
    input: str | None  # the path or s3:// URL it read
    input_identity: str | None  # what the input was at submit (size, mtime, inode; ETag)
    input_bytes: str | None  # a schedule's fire: the bytes' size and SHA-256, or size and ETag
    output_format: str | None  # db, npy, both or parquet
    output: str | None  # where it went: `db`, a file, an s3:// URL
    mxq_version: str | None
    schedule: str | None  # the inference schedule whose fire submitted it
    fire_id: int | None
    submitted_at: str | None
    finished_at: str | None
    output_removed_at: str | None  # when `mxq gc` removed that output (MXQ_KEEP_OUTPUT_DAYS)


class UnscoredInput(TypedDict):
    """A file of an inference schedule's input whose bytes a version has not scored."""

    location: str
    size: int


class VersionScored(TypedDict):
    """What one model version produced: its prediction sets, over how many distinct inputs
    (by their bytes where a schedule scored them), how many succeeded."""

    model: str
    version: int
    prediction_sets: int
    inputs: int
    succeeded: int
