"""The two inference engines behind one interface, and which one a job gets.

MXNet runs the stored model; ONNX Runtime runs its ONNX export (`tasks.onnx_export`). For
`--engine auto` the first job of a model version on a kind of device (on a GPU, a GPU model:
`mxq.engines.figures_key`) measures both engines on a few batches of its own batch size on that worker's
device and stores their samples/s (`registry.record_engine_speeds`); every later job of that
version there reads the choice (`mxq.engines.choose`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mxq import engines as rule
from mxq.db import registry
from mxq.db.records import CLASSIFIER_OUTPUTS, ModelRecord
from mxq.device import Device
from mxq.errors import device_fault, first_line
from mxq.tasks.inference import verdicts
from mxq.tasks.job_context import JobContext, JobInputError
from mxq.tasks.model_store import output_kinds
from mxq.tasks.model_store.checksums import ChangedFile, verify
from mxq.tasks.model_store.locations import local_file
from mxq.tasks.runtimes import onnx_runtime
from mxq.workers.settings import Settings

# A batch as the engines take it (preprocessed float32 inputs) and give it (class probabilities).
Batch = NDArray[np.float32]

# Each engine is timed on batches of the job's size (kept between these bounds), after one
# untimed warm-up, in MEASURE_ROUNDS turns taken in alternation, each of at least
# MEASURE_BATCHES batches and MEASURE_SECONDS; an engine's figure is its best turn.
MEASURE_ROUNDS, MEASURE_BATCHES, MEASURE_SECONDS = 3, 1, 0.1
MEASURE_BATCH_RANGE = (16, 256)


class StoreChanged(JobInputError):
    """A stored model file changed since registration: the job fails, whatever the engine."""


class NonFiniteOutput(Exception):
    """A batch's class probabilities hold NaN or an infinity: mxq stores only finite scores, on
    every engine and output kind. `row` is the first such sample of the batch; the caller,
    which knows where the batch starts and what its input was, words the job's error
    (`describe`) as a JobInputError: this is not a user-facing error of its own."""

    def __init__(self, row: int, found: str) -> None:
        super().__init__(f"model output for sample {row} of the batch is {found}")
        self.row, self.found = row, found

    def describe(self, index: int, sample: Batch) -> str:
        """The job's one-line error for sample `index` whose (preprocessed) input is `sample`."""
        flat = np.asarray(sample, dtype=np.float64).ravel()
        if not np.isfinite(flat).all():
            cause = "its input holds NaN or inf (--reject-nan names the first such input)"
        else:
            top = float(np.abs(flat).max()) if flat.size else 0.0
            cause = (f"its input is finite (largest magnitude {top:.4g} after preprocessing), so "
                     "the model overflows on it: check the input's values and the version's "
                     "--scale/--mean/--std")
        return f"model output for sample {index} is {self.found}: {cause}; allowed: finite scores only"


def first_non_finite(out: Batch) -> tuple[int, str] | None:
    """The first row of `out` (inputs or probabilities) holding NaN or an infinity, and which
    (NaN first), or None."""
    good = np.isfinite(out)
    if good.all():  # one pass; the search below only where it fails
        return None
    bad = ~good.reshape(len(out), -1)
    row = int(np.argmax(bad.any(axis=1)))
    values = out.reshape(len(out), -1)[row][bad[row]]
    found = "NaN" if np.isnan(values).any() else ("-inf" if (values < 0).all() else "inf")
    return row, found


@dataclass
class Engine:
    name: str  # "mxnet" or "onnx"
    forward: Callable[[Batch], Batch]  # class probabilities of one batch, float32
    release: Callable[[], None]  # after running out of memory: free what the engine holds
    cached: bool  # the model was already loaded in this process
    reason: str  # why this engine
    precision: str = "fp32"  # or a variant of the version: "int8", "fp16" (tasks.model_store.variants)
    precision_reason: str = "full precision"
    # the variant's check on the job's first samples (`vetted`): its seconds, and whether its
    # figure was remembered from an earlier check of the same input (`verdicts`); None for fp32
    check: VariantCheck | None = None
    # its outputs on the input's first samples, computed by that check: the job's own first
    # outputs, not computed again (tasks.inference.infer takes them); None once taken
    first_outputs: Batch | None = None


@dataclass
class VariantCheck:
    """What vetting a variant cost a job: a fixed cost, reported with the job's result, and how
    many of the check's outputs the job kept as its own (`samples_reused`)."""

    seconds: float
    remembered: bool
    samples_reused: int = 0


def _release(net: object) -> None:
    """Drop the net's compiled graph and the memory it holds; the next call builds it anew.

    A `static_alloc` graph (tasks.models.load) keeps the buffers it got before an allocation
    failed, and then every later call fails too, at any batch size (seen with MXNet 1.9.1).
    """
    clear = getattr(net, "_clear_cached_op", None)  # what Gluon's own hybridize() calls
    if clear is not None:
        clear()


def _label(model: ModelRecord) -> str:
    return f"{model['name']}:{model['version']}"


def _checked(model: ModelRecord, forward: Callable[[Batch], Batch]
             ) -> Callable[[Batch], Batch]:
    """`forward` that fails the job, before anything is written, when the output is not one row
    of the model's classes per sample (a version registered before registration proved it).
    Whether it is finite the job checks once per read (`first_non_finite`)."""
    def run(x: Batch) -> Batch:
        out = forward(x)
        if out.shape[:1] != x.shape[:1]:
            raise JobInputError(f"model {_label(model)}: its output has {len(out)} rows for a batch "
                                f"of {len(x)}: the symbol fixes the batch size (e.g. a reshape to a "
                                "constant shape); allowed: symbols whose batch dimension follows "
                                "the input")
        if out.ndim != 2 or out.shape[1] != model["classes"]:
            raise JobInputError(f"model {_label(model)}: its output has shape {out.shape} for a "
                                f"batch of {len(x)}; registered as (batch, {model['classes']})")
        return out

    return run


def mxnet_engine(settings: Settings, model: ModelRecord, device: Device, reason: str) -> Engine:
    """MXNet on the worker's device (imported here: a worker serving ONNX only never loads it).
    Each new batch size is checked by shape inference before it runs: running a symbol that
    fixes its batch can corrupt memory and crash the worker."""
    from mxq.tasks.model_store.model_error import ModelError
    from mxq.tasks.model_store.models import load, probabilities
    from mxq.tasks.model_store.mxnet.batch_proof import check_batch
    from mxq.tasks.runtimes.mx_context import context

    ctx = context(device)
    try:
        net, cached = load(settings, model, ctx)
    except ChangedFile as exc:
        raise StoreChanged(str(exc)) from None
    except ModelError as exc:
        raise JobInputError(str(exc)) from None
    proven: set[tuple[int, ...]] = set()
    outputs = model.get("outputs") or "logits"  # a version from before 0016 output logits

    def forward(x: Batch) -> Batch:
        if x.shape not in proven:
            try:
                check_batch(net, _label(model), x.shape[1:], len(x))
            except ModelError as exc:
                raise JobInputError(str(exc)) from None
            proven.add(x.shape)
        return probabilities(net, ctx, x, outputs, model.get("heads"))

    return Engine("mxnet", _checked(model, forward), lambda: _release(net), cached, reason)


def onnx_engine(settings: Settings, model: ModelRecord, kind: str, reason: str,
                precision: str = "fp32") -> Engine:
    """ONNX Runtime on the version's export, or on its `precision` variant (its file in the
    home of `settings`, fetched from the store when missing)."""
    onnx = model.get("onnx") or {}
    if not onnx.get("file"):
        raise JobInputError(f"model {model['name']}:{model['version']} has no ONNX export "
                            f"({onnx.get('error') or 'it was registered before mxq exported models'})"
                            "; use --engine mxnet or auto")
    if (missing := onnx_runtime.unavailable(kind)) is not None:
        if rule.plain_onnx(onnx):  # nothing else runs it: another worker must
            raise JobInputError(f"{rule.onnx_only(_label(model))}: {missing} on this worker")
        raise JobInputError(f"--engine onnx: {missing} on this worker; use --engine mxnet or auto")
    built = onnx if precision == "fp32" else model["variants"].get(precision)
    if not built:
        raise JobInputError(rule.no_variant(_label(model)))
    what = "ONNX file" if precision == "fp32" else f"{precision} variant"
    path = local_file(settings, model, built["file"])
    if not path.is_file():
        raise JobInputError(f"{what} {path} of {_label(model)} is missing")
    try:
        verify(path, built.get("sha256"), what, _label(model))
    except ChangedFile as exc:
        raise StoreChanged(str(exc)) from None
    sess, cached = onnx_runtime.session(path, kind)
    return Engine("onnx", _checked(model, onnx_runtime.runner(sess)),
                  lambda: onnx_runtime.forget(path, kind), cached, reason, precision)


def _rate(engine: Engine, sample: Batch) -> float:
    began, batches = time.perf_counter(), 0
    while batches < MEASURE_BATCHES or time.perf_counter() - began < MEASURE_SECONDS:
        engine.forward(sample)
        batches += 1
    return batches * len(sample) / (time.perf_counter() - began)


def _rates(built: dict[str, Engine], sample: Batch) -> dict[str, float]:
    """Each engine's samples/s on `sample`: warmed up (graph building, allocation), then timed in
    turns taken in alternation, its best turn kept. Timing one engine after the other let a
    neighbour's load on a shared host fall on one of them and flip the choice between two close
    ones (fp32 and fp16 on a CPU, seen here)."""
    for engine in built.values():
        engine.forward(sample)
    best = dict.fromkeys(built, 0.0)
    for _ in range(MEASURE_ROUNDS):
        for name, engine in built.items():
            best[name] = max(best[name], _rate(engine, sample))
    return best


def _figures_key(job: JobContext) -> str:
    return rule.figures_key(job.parsed_device.kind, job.settings.device_model)


def _measure(job: JobContext, model: ModelRecord, batch_size: int, which: list[str]) -> dict[str, float]:
    """The samples/s of each engine (or precision) in `which` on this worker, on a seeded batch
    of the model's input shape, stored beside the figures measured before; its time is the
    job's `engine_measure` cost."""
    began = time.perf_counter()
    try:
        return _measured(job, model, batch_size, which)
    finally:
        job.costs.engine_measure += time.perf_counter() - began


def _measured(job: JobContext, model: ModelRecord, batch_size: int, which: list[str]) -> dict[str, float]:
    low, high = MEASURE_BATCH_RANGE
    batch = np.random.default_rng(0).random((min(max(batch_size, low), high), *model["input_shape"]),
                                            dtype=np.float32)
    kind = job.parsed_device.kind

    def build(name: str) -> Engine:
        if name == "mxnet":
            return mxnet_engine(job.settings, model, job.parsed_device, "")
        return onnx_engine(job.settings, model, kind, "", "fp32" if name == "onnx" else name)

    key = _figures_key(job)
    speeds = {**((model.get("engines") or {}).get(key) or {}),
              **_rates({name: build(name) for name in which}, batch)}
    registry.record_engine_speeds(job.url, model["name"], model["version"], key, speeds)
    model["engines"] = {**(model.get("engines") or {}), key: speeds}
    return speeds


def _fp32_choice(job: JobContext, model: ModelRecord, asked: str, batch_size: int
                 ) -> tuple[rule.Choice | None, dict[str, float] | None, str | None]:
    """The full-precision engine for `asked` (measuring both first, for `auto`, when no figures
    exist), the speeds known, or (None, None, why) when MXNet must serve unmeasured."""
    kind, mxnet_unusable = job.parsed_device.kind, job.settings.mxnet_unusable
    if asked == "auto" and mxnet_unusable is None and not rule.plain_onnx(model.get("onnx")) \
            and (missing := onnx_runtime.unavailable(kind)):
        return None, None, missing
    speeds = (model.get("engines") or {}).get(_figures_key(job))
    if mxnet_unusable is None and rule.needs_measuring(asked, model.get("onnx"), speeds):
        try:
            speeds = _measure(job, model, batch_size, ["mxnet", "onnx"])
        except StoreChanged:
            raise
        except Exception as exc:  # one engine could not run here: MXNet serves (or says why not)
            if device_fault(exc):  # no engine runs on a failed device: the device is out
                raise
            return None, None, f"not measured: {first_line(exc)}"
    try:
        return rule.choose(asked, model.get("onnx"), speeds, mxnet_unusable), speeds, None
    except rule.NoEngine as exc:
        raise JobInputError(f"{_label(model)} on {job.device}: {exc}") from None


def _precision(job: JobContext, model: ModelRecord, asked: str, p: Precision, fp32: rule.Choice,
               speeds: dict[str, float] | None, batch_size: int
               ) -> tuple[rule.Choice, rule.PrecisionChoice]:
    """The full-precision engine and the precision for the job, measuring first the variants
    that could serve and have no figures on this kind of device.

    Full precision is measured again in the same turns, both engines where `auto` chooses
    between them by measurement, and chosen again: the figures stored are compared with each
    other by every later job. (Measured again alone, ONNX Runtime's figure from a slow moment
    fell below MXNet's older one, and LeNet's later jobs ran MXNet's float32, int8 judged
    slower than MXNet's figure from another moment.)"""
    variants, left_out = rule.variants_for(job.parsed_device.kind, model["variants"])
    if left_out and p.asked in model["variants"] and p.asked not in variants:
        raise JobInputError(f"--precision {p.asked} on {job.device}: {left_out}; use --precision "
                            "fp16 or auto there, or run it on a CPU device")
    which = rule.unmeasured(p.asked, p.min_agreement, variants, speeds)
    if which and onnx_runtime.unavailable(job.parsed_device.kind) is None:
        measured = _measure_variants(job, model, asked, fp32, which, batch_size)
        if isinstance(measured, rule.PrecisionChoice):
            return fp32, measured
        fp32, speeds = measured
    chosen = rule.choose_precision(p.asked, p.min_agreement, variants, speeds, fp32.engine)
    if left_out and chosen.reason != "asked":
        chosen = rule.PrecisionChoice("fp32", f"{chosen.reason}; {left_out}")
    return fp32, chosen


def _measure_variants(job: JobContext, model: ModelRecord, asked: str, fp32: rule.Choice,
                      which: list[str], batch_size: int
                      ) -> tuple[rule.Choice, dict[str, float]] | rule.PrecisionChoice:
    """Measure the variants `which` with full precision in the same turns (both engines where
    `auto` chooses between them, then chosen again): the full-precision engine and the speeds,
    or full precision's choice when a variant could not run here."""
    mxnet_unusable = job.settings.mxnet_unusable
    both = mxnet_unusable is None and rule.needs_measuring(asked, model.get("onnx"), None)
    try:
        speeds = _measure(job, model, batch_size, [*which, *(rule.RUNTIMES if both else [fp32.engine])])
    except StoreChanged:
        raise
    except Exception as exc:  # a variant could not run here: full precision serves
        if device_fault(exc):
            raise
        return rule.PrecisionChoice("fp32", f"{' and '.join(which)} not measured: {first_line(exc)}")
    if both:
        fp32 = rule.choose(asked, model.get("onnx"), speeds, mxnet_unusable)
    return fp32, speeds


@dataclass(frozen=True)
class Precision:
    """What a job asked of precision (`--precision`, `--min-agreement`)."""

    asked: str | None = None
    min_agreement: float | None = None


def pick(job: JobContext, model: ModelRecord, asked: str, batch_size: int,
         precision: Precision = Precision()) -> Engine:
    """The engine and precision this job runs in (measuring first, for `auto`, what has no
    figures on this kind of device, on batches of `batch_size`). A worker whose GPU MXNet cannot
    run serves ONNX only, as does every worker a plain ONNX version (no MXNet graph)."""
    device = job.parsed_device
    if (problem := rule.engine_problem(asked, model.get("onnx"), _label(model))) is not None:
        raise JobInputError(problem)
    fp32, speeds, unmeasured = _fp32_choice(job, model, asked, batch_size)
    if fp32 is None:
        assert unmeasured is not None
        return mxnet_engine(job.settings, model, device, unmeasured)
    chosen = rule.PrecisionChoice("fp32", "--engine mxnet asked: variants run on ONNX Runtime")
    if not (asked == "mxnet" and precision.asked not in rule.VARIANTS):
        fp32, chosen = _precision(job, model, asked, precision, fp32, speeds, batch_size)
    if chosen.precision != "fp32":
        why = fp32.reason if fp32.engine == "onnx" else \
            f"the {chosen.precision} variant runs on ONNX Runtime"
        engine = onnx_engine(job.settings, model, device.kind, why, chosen.precision)
    elif fp32.engine == "onnx":
        engine = onnx_engine(job.settings, model, device.kind, fp32.reason)
    else:
        engine = mxnet_engine(job.settings, model, device, fp32.reason)
    engine.precision_reason = chosen.reason
    return engine


# The job's own first samples a variant is checked on against float32 before it serves the job.
CHECK_SAMPLES = 256


def vetted(job: JobContext, model: ModelRecord, engine: Engine, first: Callable[[], Batch],
           asked: str, precision: Precision, seen: verdicts.InputSeen | None = None) -> Engine:
    """`engine` once its variant agrees with float32 on `first()` (the input's first
    CHECK_SAMPLES samples) as the job's bound asks; else the float32 engine, saying why. A
    variant's figure comes from held-out samples of its calibration file, which may not be like
    the job's input (a constant file gave "100.00 %", and 1,609 of 1,797 real predictions then
    differed). Asked by name, a variant serves whatever it measures, and the job's record says
    what it measured. For an input this worker checked before (`seen`), the figure is
    remembered (`verdicts`): neither the samples nor the two forwards are needed again."""
    if engine.precision == "fp32":
        return engine
    began = time.perf_counter()
    variant = model["variants"][engine.precision]
    kind = output_kinds.judged(model)
    key = verdicts.checked_on(model["name"], model["version"], variant.get("sha256"), seen)
    figure = remembered = verdicts.recall(key)
    full_outputs = None
    if figure is None:
        samples = first()
        full = onnx_engine(job.settings, model, job.parsed_device.kind, "", "fp32")
        engine.first_outputs, full_outputs = engine.forward(samples), full.forward(samples)
        figure = verdicts.Figure(output_kinds.agreement(kind, engine.first_outputs, full_outputs),
                                 len(samples))
        verdicts.remember(key, figure)
    engine.check = VariantCheck(round(time.perf_counter() - began, 4), remembered is not None)
    bound = precision.min_agreement if precision.min_agreement is not None else variant.get("bound")
    said = (f"{engine.precision} agreed with float32 on {figure.agreement:.2%} of this input's first "
            f"{figure.samples} samples" + ("" if kind in CLASSIFIER_OUTPUTS else
                                           f" ({output_kinds.measure(kind)})"))
    if precision.asked == engine.precision or bound is None or figure.agreement >= float(bound):
        engine.precision_reason = f"{engine.precision_reason}; {said}"
        return engine
    fallback = pick(job, model, asked, figure.samples, Precision("fp32"))
    fallback.precision_reason = (f"{said}, below the bound {float(bound):.2%} (its figure, "
                                 f"{float(variant['agreement']):.2%}, is of held-out samples of "
                                 f"{variant['calibration']['source']}): full precision serves")
    fallback.check = engine.check
    if fallback.name == "onnx":  # the same float32 export the check ran
        fallback.first_outputs = full_outputs
    return fallback
