"""The parameters each job kind accepts, checked at submit and again by the worker.

One pydantic model per kind: the error names the field, the value and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from mxq.db.records import OUTPUT_KINDS
from mxq.device import Device
from mxq.errors import UserError
from mxq.names import MAX_ID, NAME_PATTERN, shown
from mxq.preprocess import Preprocess, PreprocessError
from mxq.since import MAX_TIME_LIMIT, TIME_LIMIT_EXAMPLES, TIME_LIMIT_PATTERN, DurationError, parse_time_limit
from mxq.workers.broker.queues import DeviceSpecError, parse_device
from mxq.workers.settings import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_EPOCHS, Settings, get_settings

# Upper bounds that keep a typo from asking a device for terabytes. Batch size and epochs are
# checked against MXQ_MAX_BATCH_SIZE / MXQ_MAX_EPOCHS (these are their defaults).
MAX_BATCH_SIZE = DEFAULT_MAX_BATCH_SIZE
MAX_TOP_K = 100
MAX_COLUMNS = 4096  # a Parquet input's columns named for one sample (a wide table of features)
MAX_COLUMN_CHARS = 256
# `--batch-size auto` starts here (or at the input's size, or MXQ_MAX_BATCH_SIZE, if smaller)
# and halves on out-of-memory until a batch fits.
AUTO_BATCH_START = 8192
# The lower precisions a version may have, as `mxq.engines.VARIANTS` names them.
Variant = Literal["int8", "fp16"]


def _at_most(value: int, info: ValidationInfo, setting: str) -> int:
    """`value` if it is within the MXQ_<SETTING> limit (from the validation context, else the
    process settings), or the same error pydantic gives for `le`, naming the setting."""
    limit = (info.context or {}).get(setting) or getattr(get_settings(), setting)
    if value > limit:
        raise PydanticCustomError("less_than_equal",
                                  "Input should be less than or equal to {le} (MXQ_{setting})",
                                  {"le": limit, "setting": setting.upper()})
    return value


# What the API's schema says `time_limit` is: seconds, or a duration string the validator reads.
_TIME_LIMIT_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_TIME_LIMIT},
                                {"type": "string", "pattern": TIME_LIMIT_PATTERN}, {"type": "null"}]}


class TimeLimited(BaseModel):
    """What every job a user submits may carry: `time_limit`, the seconds it may run, counted
    from its first start across its attempts (its parent's, for a chunk or a node's part). Past
    it, the job stops at its next checkpoint, keeps what it committed, and fails naming the limit
    (`mxq.tasks.runner.JobTimedOut`)."""

    time_limit: Annotated[int | None, WithJsonSchema(_TIME_LIMIT_SCHEMA)] = Field(
        None, ge=1, le=MAX_TIME_LIMIT, description="The most it may run, in seconds or as a "
        "duration (90s, 45m, 2h, 1h30m), counted from its first start across attempts; past it "
        "the job stops at its next checkpoint (a committed flush, an epoch's checkpoint), keeps "
        "what it committed and fails naming the limit. Unset: no limit.")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value  # seconds: pydantic's own checks name what is wrong with them
        try:
            return parse_time_limit(value)
        except DurationError:
            raise PydanticCustomError("duration", f"expected {TIME_LIMIT_EXAMPLES}") from None


# The probe's convolution: a batch of RGB 64x64 images through 16 3x3 filters, padded to size.
CONV_SHAPE = (3, 64, 64)
CONV_FILTERS, CONV_KERNEL = 16, 3


def probe_flops(size: int, batch: int, repeat: int) -> int:
    """The work a probe does: `repeat` timed rounds plus one warm-up of a size x size matrix
    multiply and of the batch's convolution (multiply-adds counted as two)."""
    conv = 2 * batch * CONV_FILTERS * CONV_SHAPE[1] * CONV_SHAPE[2] * CONV_SHAPE[0] * CONV_KERNEL**2
    return (repeat + 1) * (2 * size**3 + conv)


class ProbeParams(TimeLimited):
    """An environment check: matrix multiply and convolution throughput on one device.

    Its work is bounded by MXQ_MAX_PROBE_GFLOP, so one probe holds a device for seconds: the
    fields' own bounds alone allowed size 16384 x repeat 10000, minutes on a big GPU."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(1024, ge=16, le=16384, description="Matrix side for the multiply.")
    batch: int = Field(32, ge=1, le=4096, description="Images per convolution batch.")
    repeat: int = Field(5, ge=1, le=10000, description="Timed rounds of each benchmark.")

    @model_validator(mode="after")
    def _within_budget(self, info: ValidationInfo) -> ProbeParams:
        limit = (info.context or {}).get("max_probe_gflop") or get_settings().max_probe_gflop
        gflop = probe_flops(self.size, self.batch, self.repeat) / 1e9
        if gflop > limit:
            raise PydanticCustomError(
                "probe_budget", "size={size}, batch={batch}, repeat={repeat} is {gflop} GFLOP of "
                "work; at most {limit} GFLOP (MXQ_MAX_PROBE_GFLOP): lower size or repeat",
                {"size": self.size, "batch": self.batch, "repeat": self.repeat,
                 "gflop": f"{gflop:,.0f}", "limit": limit})
        return self


class InferRequest(TimeLimited):
    """Bulk inference of one model over one input: what a user asks for (`mxq infer`, the API)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(min_length=1)
    model_version: int | None = Field(None, ge=1, le=MAX_ID)
    input: str = Field(min_length=1)
    key: str | None = Field(None, description="Array name inside an .npz input.")
    columns: list[Annotated[str, Field(min_length=1, max_length=MAX_COLUMN_CHARS)]] | None = Field(
        None, min_length=1, max_length=MAX_COLUMNS, description="A Parquet input's columns that "
        "hold a sample: one list column of numbers, or numeric columns side by side; unset: its "
        "only list column, else all its columns if all are numbers.")
    batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        256, description="Samples per batch, or 'auto': the largest that fits, halving from "
        "AUTO_BATCH_START.")
    output: Literal["db", "npy", "both", "parquet"] = Field(
        "db", description="Where predictions go: SQL rows (db), the probabilities as "
        "$MXQ_HOME/outputs/<stack id>/job-ID.npy (npy), both, or "
        "$MXQ_HOME/outputs/<stack id>/job-ID.parquet (parquet).")
    engine: Literal["auto", "mxnet", "onnx"] = Field(
        "auto", description="MXNet, ONNX Runtime on the model's ONNX export, or 'auto': the one "
        "measured faster for this model on this kind of device (MXNet where ONNX disagrees).")
    precision: Literal["auto", "fp32"] | Variant | None = Field(
        None, description="fp32 (full precision), int8 or fp16 (the version's variant of that "
        "precision, on ONNX Runtime), or 'auto': the fastest variant whose agreement with float32 "
        "meets min_agreement, only where it measured faster than float32 on this kind of device; "
        "unset: as the version was quantized (auto within its --min-agreement), else fp32.")
    min_agreement: float | None = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False, description="With precision 'auto': the least "
        "argmax agreement with float32, on held-out calibration samples, a variant must have "
        "shown to serve (e.g. 0.99).")
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="A classifier's k best classes; a "
        "multi-label model's k best labels.")
    threshold: float | None = Field(
        None, gt=0.0, lt=1.0, allow_inf_nan=False, description="A multi-label model's labels "
        "kept per sample: those whose probability is at least this (default 0.5 when top_k is 0).")
    reject_nan: bool = False
    chunk_size: int | None = Field(None, ge=1)
    output_to: str | None = Field(
        None, min_length=1, max_length=1100, description="Where a Parquet or npy output goes "
        "instead of $MXQ_HOME/outputs: s3://BUCKET/PREFIX inside MXQ_S3_ALLOWED; the job writes "
        "PREFIX/STACK/job-ID.parquet or .npy (STACK: the stack's id; its parts under "
        "PREFIX/STACK/job-ID.*.parts/ while it runs); a prefix inside another job's output is refused.")

    @field_validator("batch_size", mode="before")
    @classmethod
    def _int_or_auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto" and not value.strip().lstrip("-").isdecimal():
            raise ValueError(f"{value!r} is neither a positive integer nor 'auto'")
        if not isinstance(value, int | str) or isinstance(value, bool):
            return value  # pydantic's own checks name what is wrong with it
        if value != "auto" and int(value) < 1:
            raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal "
                                      "to {ge}", {"ge": 1})
        return value

    @field_validator("batch_size")
    @classmethod
    def _batch_limit(cls, value: int | str, info: ValidationInfo) -> int | str:
        return value if isinstance(value, str) else _at_most(value, info, "max_batch_size")


class InferParams(InferRequest):
    """An inference job as stored: the request, or one chunk [start, stop) of it, which only mxq
    sets when it fans a job out (never a user: the API's schema has no such fields)."""

    start: int | None = Field(None, ge=0)
    stop: int | None = Field(None, ge=1)
    # What the input was when the job was submitted (`locate.identity`): every attempt and chunk
    # reads those bytes or fails, never a mix of two versions.
    input_identity: str | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _range(self) -> InferParams:
        if self.start is not None and self.stop is not None and self.stop <= self.start:
            raise ValueError(f"chunk range [{self.start}, {self.stop}) is empty")
        return self


ARCHS = ("mlp", "lenet", "resnet18_v1")  # the built-in architectures (tasks/model_store/zoo.py builds them)
MAX_ARCH_NAME = 64  # a registered architecture's name (it is a model version's `arch`)
MAX_ARCH_BYTES = 1 << 20  # an architecture's Python file
SHA256_PATTERN = r"^[0-9a-f]{64}$"
FACTORY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"  # a Python function name
# Datasets a training names instead of a file (tasks/training/datasets.BUILTIN loads them).
BUILTIN_DATASETS = ("digits",)
MAX_EPOCHS = DEFAULT_MAX_EPOCHS
MAX_DEVICES = 64
MAX_NODES = 64
MAX_CHANNELS = 4096  # --mean/--std values: one, or one per channel


class DistRole(BaseModel):
    """One node's part of a multi-node training: set by the job's leader, never by users."""

    model_config = ConfigDict(extra="forbid")

    parent: int = Field(description="The multi-node job this part belongs to.")
    index: int = Field(ge=0, description="The part's place (0 hosts the scheduler and server).")
    node: str = Field(description="The node the part runs on.")
    host: bool = Field(False, description="Also run the ps-lite scheduler and server roles.")
    env: dict[str, str] = Field(description="DMLC_* settings every role of the job shares.")


def _named_device(entry: str) -> str:
    """One device of a training's device list, as a worker names it (`gpu:0`): a device on this
    node, never `auto` (a kind's pool is the job's device, not a list entry) nor `@NODE`."""
    try:
        spec = parse_device(entry)
    except DeviceSpecError:
        raise ValueError(f"--device {entry!r} is not a device of this node: list gpu:N or cpu:N "
                         "(N a device index such as 0), e.g. gpu:0,gpu:1") from None
    if spec.auto:
        raise ValueError(f"--device {entry} names no device: list devices of one node (gpu:0,gpu:1), "
                         f"or ask for any of a kind as the job's device ({spec}), as `mxq train "
                         f"--device {spec}` does")
    return str(spec)


class TrainOptions(TimeLimited):
    """How to train (architecture, devices, epochs, optimizer, ...): what a training job and a
    retraining schedule share."""

    model_config = ConfigDict(extra="forbid")

    arch: str | None = Field(
        None, pattern=NAME_PATTERN, max_length=MAX_ARCH_NAME, description="An architecture "
        "trained from scratch (or from_model): a built-in (mlp, lenet, resnet18_v1) or one "
        "registered with `mxq arch add` (`GET /archs`), its newest version pinned at submit.")
    from_model: str | None = Field(
        None, pattern=NAME_PATTERN, description="Retrain this registered model's own graph (its "
        "promoted version, or from_version), with its weights (or re-initialized: reinit), its "
        "input shape, classes, outputs and preprocessing; instead of arch.")
    from_version: int | None = Field(None, ge=1, le=MAX_ID, description="from_model's version "
                                     "(unset: its promoted one, pinned at submit).")
    reinit: bool = Field(False, description="from_model: train its graph from fresh weights.")
    scale: float | None = Field(None, gt=0, allow_inf_nan=False, description="Preprocessing, as "
                                "`mxq models add --scale`: inputs times this (unset: the model's "
                                "stored preprocessing, else the dataset's own).")
    mean: list[Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        None, min_length=1, max_length=MAX_CHANNELS, description="Preprocessing: subtracted "
        "after the scale, one value or one per channel.")
    std: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        None, min_length=1, max_length=MAX_CHANNELS, description="Preprocessing: divided by "
        "last, one value or one per channel.")
    layout: Literal["NCHW", "NHWC"] | None = Field(None, description="Preprocessing: where the "
                                                   "channel axis is (unset: NCHW).")
    devices: int = Field(1, ge=1, le=MAX_DEVICES)
    device_list: list[str] | None = None
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Nodes to train on (dist_sync).")
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.1, gt=0, le=100, allow_inf_nan=False)
    optimizer: Literal["sgd", "adam", "nag"] = "sgd"
    momentum: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False, description="sgd and "
                                   "nag: the momentum (unset: 0.9).")
    weight_decay: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description="L2 weight decay.")
    lr_schedule: Literal["constant", "step", "cosine"] = Field(
        "constant", description="The learning rate by epoch: constant, step (times lr_factor every "
        "lr_step epochs) or cosine (from lr down to 0 over the epochs).")
    lr_step: int | None = Field(None, ge=1, description="step: epochs between two steps (unset: a "
                                "third of the epochs, at least 1).")
    lr_factor: float = Field(0.1, gt=0, le=1, allow_inf_nan=False, description="step: the "
                             "learning rate's factor at each step.")
    dtype: Literal["float32", "float16"] = "float32"
    val_fraction: float = Field(0.2, ge=0, lt=1)
    seed: int = 0
    label_column: str = "label"
    input_shape: list[int] | None = Field(None, description="Image datasets: C,H,W to resize to.")
    calibration: str | None = Field(
        None, min_length=1, max_length=1100, description="Samples the trained version's variants "
        "are built from (as `mxq models quantize --calibration`); a scheduled retraining "
        "builds them only for a version it promotes.")
    variants: list[Variant] = Field(
        ["int8"], min_length=1, max_length=2, description="With calibration: the precisions of "
        "the variants built (`mxq models quantize --precision`).")
    min_agreement: float | None = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False, description="With calibration: jobs that set "
        "no precision run the variant within this agreement (`mxq models quantize --min-agreement`).")

    @field_validator("epochs")
    @classmethod
    def _epochs_limit(cls, value: int, info: ValidationInfo) -> int:
        return _at_most(value, info, "max_epochs")

    @field_validator("batch_size")
    @classmethod
    def _batch_limit(cls, value: int, info: ValidationInfo) -> int:
        return _at_most(value, info, "max_batch_size")

    @field_validator("device_list")
    @classmethod
    def _named_devices(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_named_device(d) for d in value]

    @model_validator(mode="after")
    def _devices_agree(self) -> TrainOptions:
        if self.device_list:
            if len(set(self.device_list)) != len(self.device_list):
                raise ValueError(f"--device lists a device twice: {','.join(self.device_list)}")
            if len({Device.parse(d).kind for d in self.device_list}) != 1:
                raise ValueError(f"--device {','.join(self.device_list)} mixes device kinds: "
                                 "list devices of one kind, e.g. gpu:0,gpu:1")
            self.devices = len(self.device_list)
            if self.nodes > 1:
                raise ValueError(f"--device {','.join(self.device_list)} names devices of one "
                                 f"node, not of --nodes {self.nodes}: use --devices K (K devices "
                                 "on each node)")
        if self.momentum is not None and self.optimizer == "adam":
            raise ValueError(f"--momentum {self.momentum} goes with --optimizer sgd or nag, not adam "
                             "(whose moments are its own)")
        self._one_source()
        if self.nodes > 1 and self.batch_size < self.nodes * self.devices:
            raise ValueError(f"batch_size={self.batch_size} is smaller than the "
                             f"{self.nodes * self.devices} devices it is split over")
        return self


    def _one_source(self) -> None:
        """An architecture, or a registered model's graph with the preprocessing it serves with."""
        if (self.arch is None) == (self.from_model is None):
            raise ValueError("give an architecture (mlp, lenet, resnet18_v1 or one of `mxq arch "
                             "ls`) or --from NAME (a registered model's graph), one of them")
        if self.from_model is None and (self.from_version is not None or self.reinit):
            raise ValueError("--reinit and a :VERSION go with --from NAME")
        given = [f"--{k}" for k in ("scale", "mean", "std", "layout") if getattr(self, k) is not None]
        if given and self.from_model is not None:
            raise ValueError(f"{' '.join(given)}: --from {self.from_model} trains with the "
                             "preprocessing its version serves with (see `mxq models "
                             f"{self.from_model}`); give preprocessing with an architecture")
        try:
            self.preprocessing()
        except PreprocessError as exc:
            raise ValueError(str(exc)) from None

    def preprocessing(self) -> Preprocess | None:
        """The preprocessing the options give (None: none given)."""
        if self.scale is None and self.mean is None and self.std is None and self.layout is None:
            return None
        prep = Preprocess(scale=1.0 if self.scale is None else self.scale,
                          mean=None if self.mean is None else tuple(self.mean),
                          std=None if self.std is None else tuple(self.std),
                          layout=self.layout or "NCHW")
        prep.check_range()
        return prep


class TrainRequest(TrainOptions):
    """Data-parallel training of a built-in architecture on one node's devices (or, with
    `nodes`, on K devices of each of N nodes through MXNet's dist_sync kvstore): what a user
    asks for (`mxq train`, the API)."""

    dataset: str = Field(min_length=1)
    name: str = Field("", pattern=NAME_PATTERN, description="The model name it registers "
                      "(unset: from_model's).")

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        """No name: a training --from NAME registers NAME's next version."""
        if isinstance(data, dict) and not data.get("name"):
            return {k: v for k, v in data.items() if k != "name"} | (
                {"name": data["from_model"]} if data.get("from_model") else {})
        return data

    @model_validator(mode="after")
    def _named(self) -> TrainRequest:
        if not self.name:
            raise ValueError("name the model the training registers (--name NAME)")
        return self


class TrainParams(TrainRequest):
    """A training job as stored: the request, plus what only mxq sets (never a user: the API's
    schema has no such fields)."""

    dist: DistRole | None = Field(None, description="Internal: this job is one node's part.")
    fire_id: int | None = Field(None, description="The schedule fire that started this job.")
    # A registered architecture (not a built-in): the code version pinned at submit, which every
    # attempt imports and the version it registers records (`arch NAME@SHA256`).
    arch_sha256: str | None = Field(None, pattern=SHA256_PATTERN)
    arch_factory: str | None = Field(None, pattern=FACTORY_PATTERN)

    @model_validator(mode="after")
    def _pinned_code(self) -> TrainParams:
        if (self.arch_sha256 is None) != (self.arch_factory is None):
            raise ValueError("arch_sha256 and arch_factory go together (pinned at submit)")
        return self


class ArchParams(BaseModel):
    """The trial of an architecture's code before it is registered (`mxq arch add`, `POST
    /archs`): a device worker imports the staged file in a child process of its own, builds the
    net with the factory, forwards random samples and, when the output is (N, classes), stores
    the file by its checksum and registers the next version of the name. Set by mxq, never by a
    job request (the API's job schema has no such kind)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, max_length=MAX_ARCH_NAME)
    file: str = Field(min_length=1, description="The staged file, under $MXQ_HOME/staging.")
    file_name: str = Field(min_length=1, max_length=256, description="Its name as given.")
    factory: str = Field(pattern=FACTORY_PATTERN)
    classes: int = Field(10, ge=2, le=2**20)
    input_shape: list[Annotated[int, Field(ge=1, le=2**16)]] = Field(min_length=1, max_length=8)
    added_by: str | None = Field(None, max_length=128)

    @field_validator("name")
    @classmethod
    def _not_builtin(cls, value: str) -> str:
        if value in ARCHS:
            raise ValueError(f"{value} is a built-in architecture: give your own a name of its own")
        return value


HEAD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")  # a file's and a Parquet column's name
MOST_HEADS = 16


def parse_heads(spec: str) -> list[tuple[str, str]] | None:
    """A registration's `--outputs`: None for one output (`auto` or a kind), else each of
    several outputs' (name, kind), in order; ValueError naming what is wrong and what is allowed."""
    kinds = ("auto", *OUTPUT_KINDS)
    if "=" not in spec:
        if spec not in kinds:
            raise ValueError(f"--outputs {spec[:60]!r}: allowed: {', '.join(kinds)}, or "
                             "NAME=KIND,NAME=KIND for a model with several outputs")
        return None
    heads = [tuple(part.strip().partition("=")[::2]) for part in spec.split(",")]
    for name, kind in heads:
        if not HEAD_NAME.match(name) or name in ("index", "labels"):
            raise ValueError(f"--outputs: output name {name[:40]!r}: allowed: a letter, then up to 31 "
                             "letters, digits or _ (not index or labels)")
        if kind not in kinds:
            raise ValueError(f"--outputs: output {name}={kind[:40]!r}: allowed kinds: {', '.join(kinds)}")
    names = [n for n, _ in heads]
    if len(set(names)) != len(names) or not 2 <= len(heads) <= MOST_HEADS:
        raise ValueError(f"--outputs: {len(heads)} outputs named {', '.join(names)[:80]}: allowed: "
                         f"2 to {MOST_HEADS} outputs, each name once")
    return [(n, k) for n, k in heads]


class RegisterParams(BaseModel):
    """A model version registered by a device worker for a process that cannot load MXNet (a
    GPU build without its driver, as in the compose `api` container; an ONNX-only install):
    `mxq models add` stages the files under $MXQ_HOME/staging and waits for this job."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="The model name it registers.")
    arch: Literal["mlp", "lenet", "resnet18_v1"] | None = None
    symbol: str | None = Field(None, description="A staged NAME-symbol.json.")
    params: str | None = Field(None, description="A staged NAME-0000.params.")
    onnx: str | None = Field(None, description="A staged plain ONNX file (mxq models add --onnx).")
    input_shape: list[Annotated[int, Field(ge=1, le=2**20)]] | None = Field(None, max_length=8)
    classes: int = Field(10, ge=1, le=2**20)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    preprocess: dict[str, object] | None = None
    outputs: str = Field("auto", max_length=600, description="What the model's output is "
        "(mxq.db.records.OUTPUT_KINDS); auto tells logits from probabilities, and takes an output "
        "of width 1 for regression. A model with several outputs names each, in order: "
        "NAME=KIND[,NAME=KIND...] (KIND may be auto).")

    @field_validator("outputs")
    @classmethod
    def _known_outputs(cls, value: str) -> str:
        parse_heads(value)  # ValueError naming what is wrong
        return value

    @model_validator(mode="after")
    def _one_source(self) -> RegisterParams:
        exported = self.symbol is not None or self.params is not None
        sources = (self.arch is not None) + exported + (self.onnx is not None)
        if sources != 1 or (exported and (self.symbol is None or self.params is None)) or \
                (self.arch is not None and not self.input_shape):
            raise ValueError("give one of arch (with input_shape), both symbol and params, or onnx")
        return self


# A job's parameters, typed: what `validate` returns and every step after it passes on, from the
# submit to the task body. They become JSON once, where they are stored (SQL) and read back from it.
JobParams = ProbeParams | InferParams | TrainParams | RegisterParams | ArchParams
SPECS: dict[str, type[JobParams]] = {"probe": ProbeParams, "infer": InferParams, "train": TrainParams,
                                     "register": RegisterParams, "arch": ArchParams}
# Parameters before validation: a request's JSON, a CLI's options, a stored row.
Raw = Mapping[str, object]


class ParamsError(UserError):
    """Job parameters that do not fit the kind's spec."""


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list | tuple):
        return any(map(_has_nul, value))
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


def _problem(e: Any) -> str:
    """`field=value: what is allowed` for one error; a check across fields (no `loc`) names its
    own fields and values, so it is shown alone, not after the whole parameter dict."""
    if not e["loc"]:
        return str(e["msg"]).removeprefix("Value error, ")
    return f"{'.'.join(map(str, e['loc']))}={shown(e.get('input'))}: {e['msg']}"


def validate(kind: str, params: Raw, settings: Settings | None = None) -> JobParams:
    """The typed parameters of a job of `kind`, defaults filled in, or ParamsError saying what
    is wrong. Size limits come from `settings` (default: the process settings)."""
    spec = SPECS.get(kind)
    if spec is None:
        raise ParamsError(f"unknown job kind {kind!r}; known kinds: {', '.join(SPECS)}")
    return validated(spec, params, settings)


P = TypeVar("P", bound=BaseModel)  # one kind's parameters (a SPECS entry)


def validated(spec: type[P], params: Raw, settings: Settings | None = None) -> P:
    """`params` as a `spec`, or ParamsError naming each wrong field, its value and what is
    allowed (checked at submit, and again where a worker reads a stored job)."""
    kind = next(k for k, v in SPECS.items() if v is spec)
    for key, value in params.items():  # PostgreSQL cannot store NUL, and no path or name has one
        if _has_nul(key) or _has_nul(value):
            where = f"{key}={value!r}".replace("\x00", "\\x00")
            raise ParamsError(f"invalid {kind} parameters: {where}: NUL characters are not allowed")
    limits = {"max_batch_size": settings.max_batch_size, "max_epochs": settings.max_epochs,
              "max_probe_gflop": settings.max_probe_gflop} if settings is not None else None
    try:
        return spec.model_validate(params, context=limits)
    except ValidationError as exc:
        problems = "; ".join(map(_problem, exc.errors()))
        raise ParamsError(f"invalid {kind} parameters: {problems}") from None


def stored(params: JobParams) -> dict[str, object]:
    """The parameters as SQL stores them (JSON): the one place a typed job becomes a dict."""
    return params.model_dump(mode="json")
