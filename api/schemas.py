"""The HTTP API's contract: every request body and every answer typed, so that the OpenAPI
description (`/openapi.json`) is what the server does and a client generated from it works.

Job requests are the public parameters of each kind (`mxq.workers.jobs.jobspecs`: what `mxq probe`,
`mxq infer` and `mxq train` take) plus where to run, told apart by `kind`; fields only mxq sets
(a chunk's range, a schedule's fire) are not in them, so a request that names one is refused.
Records are the TypedDicts `mxq.db` returns (`mxq.db.records`). Every error is one RFC 9457
problem document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import TypedDict

from mxq.db.records import (
    HOOK_EVENTS,
    ArchRecord,
    DeliveryRecord,
    FireRecord,
    HookCreated,
    HookRecord,
    JobRecord,
    LogPage,
    ModelRecord,
    PredictionRow,
    QueueEntry,
    ScheduleDetail,
    ScheduleRecord,
)
from mxq.names import MAX_ID, NAME_PATTERN
from mxq.since import DURATION_PATTERN
from mxq.status import MOST_AFTER, MOST_AFTER_LISTED, JobStatus
from mxq.workers.fleet.gpu_health import NvmlHealth
from mxq.workers.hardware.unplanned import Cause
from mxq.workers.jobs.archs import FILE_NAME
from mxq.workers.jobs.jobspecs import (
    FACTORY_PATTERN,
    MAX_ARCH_BYTES,
    MAX_ARCH_NAME,
    InferRequest,
    ProbeParams,
    TrainOptions,
    TrainRequest,
)
from mxq.workers.schedules.cron import MAX_CRON_CHARS
from mxq.workers.webhooks.targets import MAX_URL, URL_PATTERN

Status = JobStatus  # a job's status as the API takes it (`?status=`): one of mxq.status's values
# `since` as `mxq jobs --since` takes it (mxq.since): an age such as 45s, 30m, 2h or 1d; an ISO
# 8601 date or time is declared by its format beside it.
SINCE_AGE_PATTERN = r"^[0-9]{1,5}[smhd]$"  # (up to 273 years back; the server takes 9 digits)


def _cron_field(number: str, names: str = "", *extra: str) -> str:
    """One cron field: `*` or a value or range, each with an optional /step, comma-separated."""
    value = f"(?:{number}|{names})" if names else f"(?:{number})"
    step = "(?:/[1-9][0-9]?)?"
    atom = "(?:" + "|".join([r"\*" + step, f"{value}(?:-{value})?" + step, *extra]) + ")"
    return f"{atom}(?:,{atom})*"


def _any_case(words: str) -> str:
    return "|".join("".join(f"[{c.upper()}{c.lower()}]" for c in w) for w in words.split())


_MONTHS = _any_case("jan feb mar apr may jun jul aug sep oct nov dec")
_DAYS = _any_case("sun mon tue wed thu fri sat")
_DOM = "0?[1-9]|[12][0-9]|3[01]"
# What a five-field cron expression looks like (minute hour day-of-month month day-of-week, with
# croniter's L, W, # and ?), declared in the OpenAPI description so that a client generator or a
# fuzzer makes valid ones. Declared, not enforced: the server's own check (workers/schedules/cron.check)
# says what is wrong in words, and refuses what fits this shape but never comes (February 30).
CRON_PATTERN = "^ *" + " +".join([
    _cron_field("[0-5]?[0-9]"), _cron_field("[01]?[0-9]|2[0-3]"),
    _cron_field(_DOM, "", "L", r"\?", f"(?:{_DOM})W"), _cron_field("0?[1-9]|1[0-2]", _MONTHS),
    _cron_field("[0-7]", _DAYS, f"(?:[0-7]|{_DAYS})#[1-5]", "L", r"\?")]) + " *$"


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return [_whole(v) for v in value] if isinstance(value, list) else value


def _takes_float(annotation: Any) -> bool:
    return annotation is float or float in get_args(annotation)


class JsonBody(BaseModel):
    """A request body read as JSON Schema reads it: strictly typed (0 is not a boolean, "5" not
    a number: refused, not coerced), except that 3.0 is the integer 3."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _json_integers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {k: v if k not in cls.model_fields or _takes_float(cls.model_fields[k].annotation)
                else _whole(v) for k, v in data.items()}


class Turn(JsonBody):
    """Which job a worker takes first: `priority` (high before normal before low, first in first
    out within one), and whether the job may yield to a waiting one of a higher level
    (`preemptible`; unset: only `low` jobs do)."""

    priority: Literal["high", "normal", "low"] = Field("normal", description="high, normal or low.")
    preemptible: bool | None = Field(None, description="May yield at a checkpoint to a waiting job "
                                     "of a higher level, to resume later (unset: low jobs only).")


class Shared(JsonBody):
    """Who besides its owner (and admins) reads what a job or schedule produces: the members of
    `team` (one its owner belongs to). Unset: its owner alone."""

    team: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$",
                             description="A team its owner belongs to (`mxq teams`); its members "
                             "read the results. Unset: the owner alone (and admins).")


class Waits(JsonBody):
    """The jobs a job waits for (`--after`, Slurm's afterok): it runs once they all succeeded,
    and fails naming the first that failed, was cancelled or was removed."""

    after: list[Annotated[int, Field(ge=1, le=MAX_ID)]] | None = Field(
        None, max_length=MOST_AFTER_LISTED, description="Jobs this one waits for: it runs once they all "
        "succeeded and fails, naming the one, if one fails or is cancelled. Each a job submitted "
        "before this one that the caller may read; none (or an empty list): it waits for none. At "
        f"most {MOST_AFTER} jobs: a job named twice counts once.")


class Routing(Turn, Shared, Waits):
    """Where a job runs: `auto`, `auto:gpu`, `auto:cpu`, `gpu:N` or `cpu:N` (with
    `allow_offline`, a device whose worker is not live yet), its turn there, and the jobs it
    waits for."""

    device: str = Field("auto", min_length=1, max_length=64,
                        description="auto, auto:gpu, auto:cpu, gpu:N or cpu:N.")
    allow_offline: bool = Field(False, description="Queue even if the device has no live worker.")


class ProbeJob(ProbeParams, Routing):
    """`mxq probe`: matrix multiply and convolution throughput of one device."""
    kind: Literal["probe"]


class InferJob(InferRequest, Routing):
    """`mxq infer`: bulk inference of a model over an input inside the data root."""
    kind: Literal["infer"]


class TrainJob(TrainRequest, Routing):
    """`mxq train`: data-parallel training on K devices (of N nodes); with `device_list`, on
    exactly those devices (the first routes the job)."""
    kind: Literal["train"]


JobRequest = Annotated[ProbeJob | InferJob | TrainJob, Field(discriminator="kind")]


class ScheduleRequest(TrainOptions, Turn, Shared):
    """A retraining schedule: when (`cron` in `tz`), on what (`dataset`, a file, folder or glob
    whose newest match each fire uses), registering which model, with which promotion policy,
    and how to train (the options of a training job)."""
    name: str = Field(pattern=NAME_PATTERN, description="The schedule's name (letters, digits, "
                      "'_', '.', '-').")
    cron: str = Field(min_length=9, max_length=MAX_CRON_CHARS, description="Five fields, e.g. '0 3 * * *'.",
                      json_schema_extra={"pattern": CRON_PATTERN})
    tz: str = Field("UTC", min_length=1, max_length=64, description="An IANA time zone.")
    dataset: str = Field(min_length=1, max_length=4096)
    model: str = Field(pattern=NAME_PATTERN, description="The model it registers.")
    promote: Literal["always", "if-better", "never"] = "if-better"
    metric: str = Field("val_accuracy", min_length=1, max_length=64)
    min_gain: float = Field(0.0, allow_inf_nan=False, description="How much better it must be.")
    min_metric: float | None = Field(None, allow_inf_nan=False, description="The promotion floor: "
                                     "a version whose metric is below it is registered and never "
                                     "promoted, whatever the policy.")


class InferScheduleRequest(InferRequest, Turn, Shared):
    """An inference schedule (`mxq schedule add NAME --infer MODEL --input GLOB`): at each `cron`
    time or `every` interval, score each file of `input` (a glob or folder in the data root, an
    `s3://` prefix or glob in MXQ_S3_ALLOWED) that `model`'s version (its promoted one, or
    `NAME:VERSION`) has not scored yet, a job each, with the options of an inference job."""
    name: str = Field(pattern=NAME_PATTERN, description="The schedule's name (letters, digits, "
                      "'_', '.', '-').")
    cron: str | None = Field(None, min_length=9, max_length=MAX_CRON_CHARS,
                             description="Five fields, e.g. '0 3 * * *' (or give `every`).",
                             json_schema_extra={"pattern": CRON_PATTERN})
    every: str | None = Field(None, min_length=1, max_length=32, pattern=DURATION_PATTERN,
                              description="Fire every DURATION (10m, 1h, 1d), instead of `cron`.")
    tz: str = Field("UTC", min_length=1, max_length=64, description="An IANA time zone.")
    device: str = Field("auto", min_length=1, max_length=64,
                        description="Where its jobs run: auto, auto:gpu, auto:cpu, gpu:N or cpu:N.")
    rescore: Literal["high", "normal", "low"] | None = Field(
        "low", description="When another version of `model` is promoted, score the inputs again "
        "with it at once, its jobs at this level; null: not on promotion.")

    @model_validator(mode="after")
    def _one_timing(self) -> InferScheduleRequest:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give cron or every (one of them)")
        return self


class PromoteRequest(JsonBody):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=MAX_ID)


class ArchRequest(JsonBody):
    """Your own architecture's code to register (`mxq arch add`): its trial runs as an `arch` job
    on a device worker, which registers NAME's next version once the output is (N, classes)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, max_length=MAX_ARCH_NAME, description="The name a "
                      "training takes as its arch; not a built-in's.")
    code: str = Field(min_length=1, max_length=MAX_ARCH_BYTES, description="The Python file's text.")
    file_name: str = Field(pattern=FILE_NAME.pattern, description="Its name, such as my_net.py.")
    factory: str = Field(pattern=FACTORY_PATTERN, description="The function that builds the net: "
                         "FUNC(classes: int, input_shape: tuple[int, ...]) -> gluon.HybridBlock.")
    classes: int = Field(10, ge=2, le=2**20, description="Classes for the trial forward.")
    input_shape: list[Annotated[int, Field(ge=1, le=2**16)]] = Field(
        min_length=1, max_length=8, description="One sample's shape for the trial forward, e.g. "
        "[1, 8, 8].")


HookEvent = Literal["job.finished", "job.failed", "version.registered", "version.promoted",
                   "schedule.fire_failed", "device.out", "device.back"]
assert get_args(HookEvent) == HOOK_EVENTS  # one list of events: mxq.db.records.HOOK_EVENTS


class HookRequest(JsonBody):
    """A webhook endpoint to add (`mxq hooks add`): its URL's host must be in
    MXQ_HOOK_ALLOWED_HOSTS, its addresses public unless that setting names them."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=8, max_length=MAX_URL, pattern=URL_PATTERN,
                     description="https://HOST[:PORT]/PATH (or http://) the events are POSTed to.")
    events: list[HookEvent] = Field(min_length=1, max_length=len(HOOK_EVENTS),
                                    description="The events it gets.")


class Problem(BaseModel):
    """Every error answer (RFC 9457, `application/problem+json`): `detail` is the one-line
    message naming what, which value and what is allowed."""

    type: str = Field("about:blank", description="Always about:blank: the status says it all.")
    title: str = Field(description="The status's phrase, e.g. Not Found.")
    status: int
    detail: str
    job_id: int | None = Field(None, description="A request recorded as a failed job: its id.")


class JobPage(TypedDict):
    items: list[JobRecord]
    total: int  # exact, unless total_capped: then at least this many match
    total_capped: bool
    limit: int
    offset: int


class SubmitAnswer(JobRecord):
    """A submitted job's record, and what the submit did."""

    # True: its message went out. False: the broker did not take it within
    # MXQ_BROKER_TIMEOUT_SECONDS; the job is queued and the reconciler publishes it. None: a
    # replay of an earlier submit with the same Idempotency-Key, which published nothing.
    published: bool | None
    replayed: bool  # the job an earlier submit with this Idempotency-Key made
    note: str | None  # either of those in words


class CancelAnswer(JobRecord):
    outcome: Literal["cancelled", "requested", "finished"]


class PredictionPage(TypedDict):
    items: list[PredictionRow]
    total: int
    limit: int
    offset: int


class NvmlReading(BaseModel):
    """What a GPU worker's heartbeat last read of its GPU through NVML (mxq.workers.fleet.nvml);
    a counter the GPU does not have is null."""

    model_config = ConfigDict(extra="allow")

    health: NvmlHealth = Field(description="fault: NVML gave a reason to take the GPU out")
    reason: str | None = Field(None, description="Why NVML takes the GPU out (null while ok)")
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    ecc_uncorrected: int | None = Field(None, description="Uncorrectable ECC errors (volatile)")
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    retired_pages_pending: bool | None = Field(None, description="GPUs before Ampere")
    clock_event_reasons: list[str] | None = Field(None, description=(
        "Why the clocks are held down now (sw_power_cap, hw_slowdown, ...)"))
    xids: list[int] = Field(default_factory=list, description="The latest critical Xids seen")


class DeviceRecord(BaseModel):
    """One device worker (`mxq devices`); what it reported of its device (name, memory, compute
    capability, a refusal) comes as further fields."""

    model_config = ConfigDict(extra="allow")

    device: str
    node: str
    queue: str
    worker: str
    alive: bool
    queued: int
    running: int
    current_job: int | None
    last_heartbeat: str | None
    heartbeat_age: float | None
    pid: int | None
    leased_by: int | None
    samples_per_sec: float | None
    started_at: str | None = None
    engines: list[str] = Field(default_factory=list, description=(
        "What the device runs: mxnet, onnx (training and probes need mxnet); none for a queue "
        "without a worker"))
    health: Literal["healthy", "out", "offline"] = Field(description=(
        "healthy: its worker beats; out: its worker refused the device (it failed its start "
        "check, or faulted during a job) and the launcher probes it again later; offline: no "
        "worker beats and none refused (stopped, or a queue without a worker)"))
    out_reason: str | None = Field(description="Why the device is out (null unless out)")
    out_since: str | None = Field(description=(
        "When the device went out, ISO 8601 UTC (null unless out)"))
    unplanned: Cause | None = Field(None, description=(
        "Why the launcher planned no worker for this GPU (null for one it did): refused at "
        "planning (memory_in_use, compute_mode, mig, mxnet_build, driver, wheels) or missing "
        "from nvidia-smi (fewer listed than MXQ_EXPECTED_GPUS); it is out, checked again on the "
        "launcher's probe cadence"))
    compute_mode: str | None = Field(None, description=(
        "nvidia-smi's compute mode: Default, Exclusive_Process (no training), Prohibited"))
    nvml: NvmlReading | None = Field(None, description=(
        "What the worker's heartbeat last read through NVML (null where NVML is not read)"))


__all__ = ["ArchRecord", "ArchRequest", "CancelAnswer", "DeviceRecord", "FireRecord", "NvmlReading",
           "JobPage", "JobRecord",
           "JobRequest", "LogPage",
           "QueueEntry",
           "ModelRecord", "PredictionPage", "PredictionRow", "Problem", "PromoteRequest", "ScheduleDetail",
           "ScheduleRecord", "ScheduleRequest", "SINCE_AGE_PATTERN", "Status", "SubmitAnswer",
           "DeliveryRecord", "HookCreated", "HookRecord", "HookRequest"]
