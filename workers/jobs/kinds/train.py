"""Training: the parameters of a data-parallel training job (`mxq train`, the API, a retraining
schedule), and what a submit checks and pins before it queues one (the dataset, the devices and
nodes it needs, the graph or architecture code it trains).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from mxq.db.fleet import describe_groups, device_model, list_workers, model_groups
from mxq.db.records import CLASSIFIER_OUTPUTS, WorkerRecord
from mxq.db.registry import find_arch, list_archs, resolve
from mxq.device import Device
from mxq.engines import plain_onnx
from mxq.names import MAX_ID, NAME_PATTERN
from mxq.preprocess import Preprocess, PreprocessError
from mxq.status import JobKind
from mxq.workers.broker.queues import DeviceSpecError, parse_device
from mxq.workers.broker.routing import describe
from mxq.workers.jobs.kinds.arch import ARCHS, FACTORY_PATTERN, MAX_ARCH_NAME, SHA256_PATTERN
from mxq.workers.jobs.kinds.params import ParamsError, TimeLimited, Variant, at_most
from mxq.workers.settings import DEFAULT_MAX_EPOCHS, Settings
from mxq.workers.storage.locate import locate

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
        return at_most(value, info, "max_epochs")

    @field_validator("batch_size")
    @classmethod
    def _batch_limit(cls, value: int, info: ValidationInfo) -> int:
        return at_most(value, info, "max_batch_size")

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

    job_kind: ClassVar[JobKind] = JobKind.TRAIN

    dataset: str = Field(min_length=1)
    name: str = Field("", pattern=NAME_PATTERN, description="The model name it registers "
                      "(unset: from_model's).")

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: object) -> object:
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


def resolve_train(settings: Settings, p: TrainParams) -> TrainParams:
    """Pin the dataset path, and refuse more devices than the node has."""
    dataset = p.dataset
    if dataset not in BUILTIN_DATASETS:
        dataset = str(locate(settings, dataset, "dataset"))
    if p.min_agreement is not None and p.calibration is None:
        raise ParamsError("--min-agreement goes with --calibration (the variant it allows)")
    check_calibration(settings, p.calibration)
    if p.dist is not None:
        raise ParamsError("dist is set by a multi-node job's leader for its parts; "
                          "ask for nodes with --nodes N")
    if p.nodes > 1:
        check_nodes(list_workers(settings.database, settings.heartbeat_ttl), p)
    else:
        _check_one_node(settings, p)
    return p.model_copy(update={"dataset": dataset, **_pinned_source(settings, p),
                                **pinned_code(settings.database, p.arch)})


def pinned_code(url: str, arch: str | None) -> dict[str, object]:
    """A registered architecture's code, pinned now: its newest version's checksum and factory,
    which every attempt imports and the version it trains records (a built-in: none)."""
    if arch is None or arch in ARCHS:
        return {"arch_sha256": None, "arch_factory": None}
    code = find_arch(url, arch)
    if code is None:
        known = [*ARCHS, *sorted({a["name"] for a in list_archs(url)})]
        raise ParamsError(f"unknown architecture {arch!r}; known: {', '.join(known)} "
                          "(`mxq arch add` registers your own)")
    return {"arch_sha256": code["sha256"], "arch_factory": code["factory"]}


def _pinned_source(settings: Settings, p: TrainParams) -> dict[str, object]:
    """A training --from NAME: the version it starts from, pinned now (the promoted one when none
    is named), so every attempt, and the version it registers, names the same graph."""
    if p.from_model is None:
        return {}
    source = resolve(settings.database, p.from_model, p.from_version)
    if source["symbol_file"] is None:
        how = "a plain ONNX file" if plain_onnx(source["onnx"]) else "registered without a symbol file"
        raise ParamsError(f"--from {p.from_model}:{source['version']}: the version has no MXNet "
                          f"graph to train ({how}); allowed: a version added with --arch or "
                          "--symbol/--params, or trained by mxq")
    if source["outputs"] not in CLASSIFIER_OUTPUTS:
        raise ParamsError(f"--from {p.from_model}:{source['version']}: the version outputs "
                          f"{source['outputs']} values, and mxq trains classifiers only; allowed: "
                          "a version whose outputs are logits or probabilities")
    return {"from_version": source["version"]}


def check_calibration(settings: Settings, where: str | None) -> None:
    """A training's calibration sample, confined and present now rather than after training."""
    if where is not None and where not in BUILTIN_DATASETS:
        locate(settings, where, "calibration file")


def _check_one_node(settings: Settings, p: TrainParams) -> None:
    """Refuse more devices than this node has of the kind, or a listed device it does not have
    (no worker known yet: the job waits for them)."""
    workers = _node_workers(settings, Device.parse(p.device_list[0]).kind if p.device_list else None)
    trainers = [w for w in workers if "mxnet" in w["engines"]]
    have = sorted(w["device"] for w in trainers)
    if have and not p.device_list:
        _check_alike(settings, p, trainers)
    for device in p.device_list or []:
        if device not in have:
            raise ParamsError(_not_trainable(settings, device, workers, have))


def _node_workers(settings: Settings, kind: str | None) -> list[WorkerRecord]:
    """This node's live workers, of one device kind where a device list names it."""
    workers = list_workers(settings.database, settings.heartbeat_ttl, settings.node)
    return [w for w in workers if kind is None or Device.parse(w["device"]).kind == kind]


def _check_alike(settings: Settings, p: TrainParams, trainers: list[WorkerRecord]) -> None:
    """Unless --device lists them, a training's devices are of one kind and one GPU model:
    refuse more than the node has alike."""
    most = max(Counter(device_model(w) for w in trainers).values(), default=0)
    if p.devices > most:
        groups = describe_groups(model_groups(trainers))
        raise ParamsError(f"{p.devices} devices asked but node {settings.node} has {most} "
                          f"alike (one kind, one GPU model) that run MXNet ({groups}); "
                          "a training job runs on one node and never mixes GPU models unless "
                          "--device lists them")


def _not_trainable(settings: Settings, device: str, workers: list[WorkerRecord],
                   have: list[str]) -> str:
    """Why a listed device cannot take part in a training: unknown, or without MXNet."""
    worker = next((w for w in workers if w["device"] == device), None)
    if worker is None:
        return (f"device {device} is not known on node {settings.node}; "
                f"known: {', '.join(sorted(w['device'] for w in workers)) or 'none'}")
    return (f"device {describe(worker)} on node {settings.node} runs ONNX Runtime only, and a "
            f"training needs MXNet; devices that can: {', '.join(have) or 'none on this node'}")


def check_nodes(known: list[WorkerRecord], p: TrainParams) -> None:
    """Refuse more nodes than have K devices of one kind and GPU model (no worker known yet: it
    waits)."""
    if not known:
        return
    per_node: dict[tuple[str, str], int] = {}
    for w in (w for w in known if "mxnet" in w["engines"]):
        key = (w["node"], device_model(w))
        per_node[key] = per_node.get(key, 0) + 1
    fit = {node for (node, _), n in per_node.items() if n >= p.devices}
    if len(fit) < p.nodes:
        have = ", ".join(f"{node} ({n} {model})" for (node, model), n in sorted(per_node.items()))
        raise ParamsError(f"{p.nodes} nodes with {p.devices} devices each asked "
                          f"but {len(fit)} nodes have that many; known: {have}")
