"""The records `mxq.db` hands to the other layers, typed: what a caller may read from them.

Each is also a JSON shape users and scripts rely on (`mxq job ID --json`, the API), so a key is
added, never renamed or dropped.
"""

from __future__ import annotations

from typing import Any, NotRequired

# pydantic (the API's answers) reads TypedDicts from typing_extensions only, on Python 3.11
from typing_extensions import TypedDict


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
    info: dict[str, Any] | None
    started_at: str | None  # when its process registered: a restart moves it
    engines: list[str]  # what its device runs: "mxnet", "onnx" (both when not said)


class MetricPoint(TypedDict):
    """One throughput point of a job (or of one of its chunks)."""

    job_id: int
    step: int
    at: str | None
    device: str | None
    samples: int
    seconds: float
    samples_per_sec: float


class EpochRecord(TypedDict):
    epoch: int
    train_loss: float
    train_accuracy: float
    val_accuracy: float | None
    seconds: float
    samples_per_sec: float
    per_device: dict[str, Any] | None
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
    removed: bool  # the schedule was removed since; the fire and its job are history


class JobRecord(TypedDict):
    """The stable JSON shape of one job (`mxq job ID --json`, `GET /api/v1/jobs/ID`)."""

    id: int
    kind: str
    status: str
    params: dict[str, Any]
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
    result: dict[str, Any] | None
    error: str | None
    parent_id: int | None
    chunk_index: int | None
    chunks: int | None
    model: str | None
    model_version: int | None
    output: str | None
    devices: list[str] | None
    # With `with_metrics` (one job's full view):
    metrics: NotRequired[list[MetricPoint]]
    events: NotRequired[list[EventRecord]]
    epochs: NotRequired[list[EpochRecord]]  # training only
    schedule: NotRequired[FirePolicy | None]  # training only


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
    metrics: dict[str, Any]
    onnx: dict[str, Any] | None  # the ONNX export and its agreement with MXNet
    engines: dict[str, dict[str, float]]  # samples/s per device kind and engine
    auto_engine: dict[str, dict[str, str]]  # what `--engine auto` runs per kind, and why
    preprocess: dict[str, Any]  # how inputs are scaled for it (`mxq.preprocess`)
    outputs: str  # "logits" (mxq applies a softmax) or "probabilities" (the model ends in one)
