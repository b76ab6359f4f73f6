"""Lower-precision variants of a model version: an int8 build of its ONNX export, calibrated on
the user's own samples, or a float16 one, each checked against float32 on samples of the user's
that the int8 build was not calibrated on.

int8: ONNX Runtime's static quantization (`quantize_static`) after its pre-processing (shape inference
and graph optimization): 8-bit activations (unsigned) and weights (signed, per output channel),
as QLinearConv/QLinearMatMul operators. Measured on this project's 2-core AVX2 host against QDQ
and signed activations, this was the fastest for LeNet and ResNet-18 (1.07x and 1.82x float32;
signed QDQ activations ran ResNet-18 at 0.77x) with the same agreement (docs/precision.md).
fp16: the export's weights and operators in float16 (ONNX Runtime's converter), its input and
output kept float32, so a job feeds and reads it as the float32 model. For the CUDA provider (Tensor
Cores); the CPU provider computes in float32 the operators it has no float16 kernel for, so it is
checked anywhere but is rarely faster on a CPU, which the first `auto` job there measures.

Whether a variant serves is decided per job (`mxq.engines.choose_precision`) from the figures
stored here and the speeds measured on each kind of device; nothing here decides it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mxq.db import registry
from mxq.db.records import CLASSIFIER_OUTPUTS, Head, ModelRecord
from mxq.errors import UserError, reason
from mxq.preprocess import Preprocess
from mxq.tasks.model_store import output_kinds
from mxq.tasks.model_store.checksums import ChangedFile, sha256, verify
from mxq.tasks.model_store.locations import local_file, publish
from mxq.tasks.runtimes import onnx_runtime
from mxq.workers.settings import Settings

FILES = {"int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}  # beside the version's model.onnx
CALIBRATION_SAMPLES = 256  # default number of samples the quantizer calibrates on
HELD_OUT_SHARE, MAX_HELD_OUT = 0.25, 2048  # kept out of calibration to check the variant
MIN_CALIBRATION, MIN_HELD_OUT = 16, 32
CHECK_BATCH = 256


class VariantError(UserError):
    """A variant cannot be built: no ONNX export, too few samples, a shape or label that does
    not fit the version, or the quantizer refused the graph (its reason)."""


@dataclass
class Calibration:
    """Samples of the user's own data, preprocessed as the version takes them; labels when the
    file has them (a training dataset), for the accuracy of both precisions."""

    x: NDArray[np.float32]
    y: NDArray[np.int32] | None
    source: str


def split(data: Calibration, samples: int, seed: int = 0
          ) -> tuple[NDArray[np.float32], Calibration]:
    """A seeded shuffle: the held-out check samples (a quarter, at most MAX_HELD_OUT), and up to
    `samples` of the rest to calibrate on."""
    n = len(data.x)
    held = min(MAX_HELD_OUT, int(n * HELD_OUT_SHARE))
    if held < MIN_HELD_OUT or n - held < MIN_CALIBRATION:
        need = max(MIN_CALIBRATION + MIN_HELD_OUT, int(np.ceil(MIN_HELD_OUT / HELD_OUT_SHARE)))
        raise VariantError(f"--calibration {data.source} has {n} samples; at least {need} are "
                           f"needed (a quarter is held out to check the variant)")
    order = np.random.default_rng(seed).permutation(n)
    check, calibrate = order[:held], order[held:held + samples]
    y = None if data.y is None else data.y[check]
    return data.x[calibrate], Calibration(data.x[check], y, data.source)


class _Batches:
    """ONNX Runtime's CalibrationDataReader over an array, a batch at a time."""

    def __init__(self, x: NDArray[np.float32], input_name: str, batch: int = 32) -> None:
        self._batches = iter([{input_name: x[i:i + batch]} for i in range(0, len(x), batch)])

    def get_next(self) -> dict[str, NDArray[np.float32]] | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # the tool's protocol; one pass is all static MinMax needs
        pass


@contextmanager
def _quiet() -> Iterator[None]:
    """The quantization tool logs a warning per weight it treats per tensor (batch norms) and
    advice through the root logger: the command prints its own figures instead."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantize_int8(fp32: Path, target: Path, x: NDArray[np.float32]) -> None:
    """Write `target`: `fp32` statically quantized to int8, calibrated on `x`."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = target.with_name(f".{target.name}.prepared")
    input_name = onnx_runtime.session(fp32)[0].get_inputs()[0].name
    try:
        with _quiet():
            quant_pre_process(str(fp32), str(prepared))
            quantize_static(str(prepared), str(target), _Batches(x, input_name),
                            quant_format=QuantFormat.QOperator, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    finally:
        prepared.unlink(missing_ok=True)


def convert_fp16(fp32: Path, target: Path) -> None:
    """Write `target`: `fp32` with float16 weights and operators, float32 input and output."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with _quiet():
        onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(target))


def _probabilities(path: Path, x: NDArray[np.float32]) -> NDArray[np.float32]:
    run = onnx_runtime.runner(onnx_runtime.session(path)[0])
    return np.concatenate([run(x[i:i + CHECK_BATCH]) for i in range(0, len(x), CHECK_BATCH)])


def compare(fp32: Path, variant: Path, held: Calibration, precision: str = "int8",
            kind: str | list[Head] = "logits") -> dict[str, Any]:
    """The variant against float32 on the held-out samples: their agreement as the version's
    output `kind` judges it (`output_kinds`: argmax agreement for a classifier, cosine
    similarity for an embedding, ...), the largest difference of an output value, and, for a
    classifier checked on labels, each precision's accuracy."""
    ours, theirs = _probabilities(variant, held.x), _probabilities(fp32, held.x)
    figures: dict[str, Any] = {
        "agreement": output_kinds.agreement(kind, ours, theirs), "measure": output_kinds.measure(kind),
        "max_diff": float(np.abs(ours - theirs).max()), "held_out": len(held.x),
        "accuracy": None}
    if held.y is not None and kind in CLASSIFIER_OUTPUTS:
        figures["accuracy"] = {"fp32": float((theirs.argmax(axis=1) == held.y).mean()),
                               precision: float((ours.argmax(axis=1) == held.y).mean())}
    return figures


def _fp32_file(settings: Settings, model: ModelRecord) -> Path:
    onnx = model.get("onnx") or {}
    if not onnx.get("file"):
        raise VariantError(f"model {model['name']}:{model['version']} has no ONNX export "
                           f"({onnx.get('error') or 'registered before mxq exported models'}); "
                           "a variant is built from it")
    if (missing := onnx_runtime.unavailable("cpu")) is not None:
        raise VariantError(f"cannot build a variant here: {missing}")
    path = local_file(settings, model, onnx["file"])
    try:
        verify(path, onnx.get("sha256"), "ONNX file", f"{model['name']}:{model['version']}")
    except ChangedFile as exc:
        raise VariantError(str(exc)) from None
    return path


def build_variant(settings: Settings, model: ModelRecord, precision: str, data: Calibration,
                  samples: int = CALIBRATION_SAMPLES, bound: float | None = None) -> ModelRecord:
    """Build, check and store the `precision` variant of `model` ("int8": calibrated on up to
    `samples` of `data`; "fp16"), checked on `data`'s held-out samples; the version's record
    with it. `bound`: jobs that set no precision may run it within that agreement. The variant's
    file is uploaded to a bucket store before its row names it."""
    fp32 = _fp32_file(settings, model)
    calibrate, held = split(data, samples)
    target = fp32.with_name(FILES[precision])
    building = target.with_name(f".{target.name}.building")  # the variant in service stays
    try:
        if precision == "int8":
            quantize_int8(fp32, building, calibrate)
        else:
            convert_fp16(fp32, building)
        figures = compare(fp32, building, held, precision, output_kinds.judged(model))
        if not np.isfinite(figures["max_diff"]):
            raise VariantError("its outputs are not finite on the held-out samples")
    except Exception as exc:  # the tools raise many types for graphs they cannot convert
        building.unlink(missing_ok=True)
        raise VariantError(f"model {model['name']}:{model['version']}: ONNX Runtime's tools "
                           f"cannot build a {precision} variant: {reason(exc)}"
                           + ("; the one built before still serves" if target.exists() else "")
                           ) from None
    building.replace(target)  # only a variant that was built and checked replaces the old one
    publish(settings, settings.database, model["name"], model["version"], [target])
    used = len(calibrate) if precision == "int8" else 0  # float16 needs no calibration
    variant = {"file": str(target), "sha256": sha256(target), **figures,
               "calibration": {"source": data.source, "samples": used}, "bound": bound,
               "built_at": datetime.now(UTC).isoformat(timespec="seconds")}
    return registry.record_variant(settings.database, model["name"], model["version"], precision,
                                   variant)


def calibration_from(x: NDArray[np.generic], y: NDArray[np.generic] | None, source: str,
                     model: ModelRecord) -> Calibration:
    """Samples as stored, checked against the version (shape, labels within its classes) and
    preprocessed as it takes them."""
    shape = tuple(model["input_shape"])
    if tuple(x.shape[1:]) != shape:
        if int(np.prod(x.shape[1:])) != int(np.prod(shape)):
            raise VariantError(f"--calibration {source}: a sample has shape {tuple(x.shape[1:])}; "
                               f"{model['name']}:{model['version']} takes {shape}")
        x = x.reshape((len(x), *shape))
    if y is not None and model.get("outputs") not in (*CLASSIFIER_OUTPUTS, None):
        y = None  # a dataset's class labels say nothing of an embedding's or regression's values
    if y is not None and len(y) and int(y.max()) >= model["classes"]:
        raise VariantError(f"--calibration {source}: label {int(y.max())} is beyond the "
                           f"{model['classes']} classes of {model['name']}:{model['version']}")
    if (row := _non_finite_row(x)) is not None:
        raise VariantError(f"--calibration {source}: sample {row} holds NaN or an infinity (in "
                           "float32, which models compute in); give finite samples")
    prep = Preprocess.from_dict(model.get("preprocess"))
    scaled = prep.apply(x)
    if (row := _non_finite_row(scaled)) is not None:
        raise VariantError(f"--calibration {source}: sample {row} is finite, but the preprocessing "
                           f"of {model['name']}:{model['version']} ({prep.describe()}) turns it "
                           "into NaN or an infinity in float32: register the version again with "
                           "a --scale, --mean or --std that keeps it finite")
    _check_spread(scaled, source)
    return Calibration(scaled, None if y is None else y.astype(np.int32), source)


def _non_finite_row(x: NDArray[np.generic]) -> int | None:
    """The first sample holding NaN or an infinity in float32 (the quantizer computes no scale
    from one), or None. Asked of the file's samples, then of the preprocessed ones, so an error
    says which of the two made it."""
    with np.errstate(over="ignore"):  # a float64 beyond float32's range: inf, found below
        finite = np.isfinite(np.asarray(x, dtype=np.float32).reshape(len(x), -1)).all(axis=1)
    return None if finite.all() else int(np.argmin(finite))


def _check_spread(x: NDArray[np.float32], source: str) -> None:
    """Refuse too few different samples to say how a variant behaves. A variant calibrated on a
    constant file was checked on held-out copies of the same sample, "agreement 100.00 %", and
    then disagreed with float32 on 1,609 of 1,797 real inputs."""
    flat = x.reshape(len(x), -1)
    distinct = len(np.unique(flat, axis=0))
    need = MIN_CALIBRATION + MIN_HELD_OUT
    if distinct < need:
        raise VariantError(f"--calibration {source}: only {distinct} different samples among "
                           f"{len(x)}; at least {need} are needed, like the inputs jobs will "
                           "score (a variant checked on copies of its calibration samples "
                           "says nothing of other inputs)")
