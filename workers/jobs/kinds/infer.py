"""Inference: the parameters of a job that runs one model over one input (`mxq infer`, the API),
and what a submit checks and pins before it queues one (the model version, the input, what the
version can output).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mxq.db.records import CLASSIFIER_OUTPUTS, HEADS, VALUE_OUTPUTS, ModelRecord
from mxq.db.registry import resolve
from mxq.engines import VARIANTS, disagreement, engine_problem, needed, precision_problem
from mxq.names import MAX_ID
from mxq.objects import check_output_prefix
from mxq.status import JobKind
from mxq.workers.broker.routing import Need
from mxq.workers.jobs.kinds.params import ParamsError, TimeLimited, Variant, at_most
from mxq.workers.paths import PathError
from mxq.workers.settings import DEFAULT_MAX_BATCH_SIZE, Settings
from mxq.workers.storage.locate import allowed_url, identity, locate, size_of

# Upper bounds that keep a typo from asking a device for terabytes. Batch size and epochs are
# checked against MXQ_MAX_BATCH_SIZE / MXQ_MAX_EPOCHS (these are their defaults).
MAX_BATCH_SIZE = DEFAULT_MAX_BATCH_SIZE
MAX_TOP_K = 100
MAX_COLUMNS = 4096  # a Parquet input's columns named for one sample (a wide table of features)
MAX_COLUMN_CHARS = 256
# `--batch-size auto` starts here (or at the input's size, or MXQ_MAX_BATCH_SIZE, if smaller)
# and halves on out-of-memory until a batch fits.
AUTO_BATCH_START = 8192


class InferRequest(TimeLimited):
    """Bulk inference of one model over one input: what a user asks for (`mxq infer`, the API)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    job_kind: ClassVar[JobKind] = JobKind.INFER

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
    def _int_or_auto(cls, value: object) -> object:
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
        return value if isinstance(value, str) else at_most(value, info, "max_batch_size")


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


Models = dict[tuple[str, int | None], ModelRecord]  # resolved once per submit


def resolve_infer(settings: Settings, p: InferParams, models: Models) -> InferParams:
    """Pin the model version and the input path the job will use, within the input size limit."""
    name, _, version = p.model.partition(":")
    if version and not version.isdigit():
        raise ParamsError(f"model version {version!r} in {p.model!r} must be a number, "
                          "as in NAME:3")
    key = (name, int(version) if version else p.model_version)
    if key not in models:
        models[key] = resolve(settings.database, *key)
    model = models[key]
    models.setdefault((name, model["version"]), model)  # as the prepared job names it
    path = locate(settings, p.input)
    size = size_of(path)
    if size > settings.max_input_bytes:
        raise PathError(f"input {p.input} holds {size} bytes, more than the "
                        f"{settings.max_input_bytes} bytes allowed (MXQ_MAX_INPUT_BYTES)")
    return p.model_copy(update={"model": name, "model_version": model["version"], "input": str(path),
                                "input_identity": identity(path),
                                "output_to": check_against_model(settings, p, model)})


def check_against_model(settings: Settings, p: InferParams, model: ModelRecord) -> str | None:
    """What the request asks of the version (precision, output, engine) is what it has: a
    ParamsError otherwise, before anything is read. Returns the checked output prefix."""
    label = f"{model['name']}:{model['version']}"
    if (problem := precision_problem(p.precision, p.min_agreement, model["variants"], label,
                                     p.engine)) is not None:
        raise ParamsError(problem)
    _check_output_kind(p, model, label)
    if (problem := engine_problem(p.engine, model.get("onnx"), label)) is not None:
        raise ParamsError(problem)
    return _output_to(settings, p)


def _check_output_kind(p: InferParams, model: ModelRecord, label: str) -> None:
    """What the job asks of its output fits what the version outputs: SQL rows are a
    classifier's, a multi-label model's or one regression value's, top-k a classifier's or a
    multi-label model's, a threshold a multi-label model's."""
    kind = model.get("outputs") or "logits"
    if kind == HEADS:
        _check_heads(p, model, label)
        return
    one_value = kind == "regression" and model["classes"] == 1  # a row's `score` holds it
    if kind in VALUE_OUTPUTS and p.output in ("db", "both") and not one_value:
        raise ParamsError(f"--output {p.output}: {label} outputs {kind} values ({model['classes']} "
                          "per sample), which SQL rows (a class and a score) cannot hold; allowed: "
                          "--output npy or parquet (rows hold one regression value, as its score)")
    if kind in VALUE_OUTPUTS and p.top_k:
        raise ParamsError(f"--top-k {p.top_k}: {label} outputs {kind} values, not classes; "
                          "allowed: --top-k 0")
    if p.threshold is not None and kind != "multilabel":
        raise ParamsError(f"--threshold {p.threshold:g}: {label} outputs {kind}, not multi-label "
                          "probabilities; allowed: no --threshold")


def _check_heads(p: InferParams, model: ModelRecord, label: str) -> None:
    """A model with several outputs writes a file per output (.npy) or a column per output
    (Parquet); top-k and a threshold go with outputs that have classes or labels."""
    heads = model.get("heads") or []
    shown = ", ".join(f"{h['name']}={h['kind']}" for h in heads)
    if p.output in ("db", "both"):
        raise ParamsError(f"--output {p.output}: {label} has {len(heads)} outputs ({shown}), which "
                          "SQL rows (a class and a score) cannot hold; allowed: --output npy or parquet")
    if p.output == "npy" and p.output_to is not None:
        raise ParamsError(f"--output npy with output_to: {label} has {len(heads)} outputs, an .npy "
                          "each, kept on the worker's disk only; allowed: --output parquet with output_to")
    kinds = {h["kind"] for h in heads}
    if p.top_k and not kinds & {*CLASSIFIER_OUTPUTS, "multilabel"}:
        raise ParamsError(f"--top-k {p.top_k}: no output of {label} has classes ({shown}); "
                          "allowed: --top-k 0")
    if p.threshold is not None and "multilabel" not in kinds:
        raise ParamsError(f"--threshold {p.threshold:g}: no output of {label} is multi-label "
                          f"({shown}); allowed: no --threshold")


def _output_to(settings: Settings, p: InferParams) -> str | None:
    """The bucket prefix a Parquet output goes to, checked like an input (MXQ_S3_ALLOWED)."""
    where = p.output_to
    if where is None:
        return None
    if p.output not in ("parquet", "npy"):
        raise ParamsError(f"output_to {where[:120]!r} takes --output parquet or npy, not "
                          f"{p.output}: SQL rows are stored in the database")
    url = check_output_prefix(allowed_url(settings, where, "output_to"))
    return str(url).rstrip("/")


def need_of(p: InferParams, models: Models) -> Need:
    """The engine the prepared job cannot run without (`mxq.engines.needed`), in words."""
    asked, model, precision = p.engine, models[(p.model, p.model_version)], p.precision
    engine = needed(JobKind.INFER, asked, model.get("onnx"), precision)
    if precision in VARIANTS and asked != engine:
        return Need(engine, f"inference with --precision {precision} (ONNX Runtime)")
    if engine is None or asked == engine:
        return Need(engine, f"inference with --engine {asked}")
    return Need(engine, f"inference of {p.model}:{p.model_version} "
                        f"({disagreement(model.get('onnx'))})")
