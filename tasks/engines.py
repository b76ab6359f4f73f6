"""The two inference engines behind one interface, and which one a job gets.

MXNet runs the stored model; ONNX Runtime runs its ONNX export (`tasks.onnx_export`). For
`--engine auto` the first job of a model version on a kind of device measures both engines on a
few batches of that worker's device and stores their samples/s (`registry.record_engine_speeds`);
every later job of that version on that kind reads the choice (`mxq.engines.choose`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mxq import engines as rule
from mxq.db import registry
from mxq.device import Device
from mxq.tasks import onnx_runtime
from mxq.tasks.models import ModelError, load, probabilities
from mxq.tasks.mx import mx
from mxq.tasks.runner import JobContext, JobInputError

MEASURE_BATCHES = 3  # timed batches per engine (after one untimed warm-up)
MEASURE_BATCH_SIZE = 256


@dataclass
class Engine:
    name: str  # "mxnet" or "onnx"
    forward: Callable[[np.ndarray], np.ndarray]  # class probabilities of one batch, float32
    release: Callable[[], None]  # after running out of memory: free what the engine holds
    cached: bool  # the model was already loaded in this process
    reason: str  # why this engine


def _release(net: Any) -> None:
    """Drop the net's compiled graph and the memory it holds; the next call builds it anew.

    A `static_alloc` graph (tasks.models.load) keeps the buffers it got before an allocation
    failed, and then every later call fails too, at any batch size (seen with MXNet 1.9.1).
    """
    clear = getattr(net, "_clear_cached_op", None)  # what Gluon's own hybridize() calls
    if clear is not None:
        clear()


def mxnet_engine(model: dict[str, Any], ctx: mx.Context, reason: str) -> Engine:
    try:
        net, cached = load(model, ctx)
    except ModelError as exc:
        raise JobInputError(str(exc)) from None
    return Engine("mxnet", lambda x: probabilities(net, ctx, x), lambda: _release(net), cached, reason)


def onnx_engine(model: dict[str, Any], kind: str, reason: str) -> Engine:
    onnx = model.get("onnx") or {}
    if not onnx.get("file"):
        raise JobInputError(f"model {model['name']}:{model['version']} has no ONNX export "
                            f"({onnx.get('error') or 'it was registered before mxq exported models'})"
                            "; use --engine mxnet or auto")
    if (missing := onnx_runtime.unavailable(kind)) is not None:
        raise JobInputError(f"--engine onnx: {missing} on this worker; use --engine mxnet or auto")
    path = Path(onnx["file"])
    if not path.is_file():
        raise JobInputError(f"ONNX file {path} of {model['name']}:{model['version']} is missing")
    sess, cached = onnx_runtime.session(path, kind)
    return Engine("onnx", lambda x: onnx_runtime.run(sess, x), lambda: None, cached, reason)


def _rate(engine: Engine, sample: np.ndarray) -> float:
    engine.forward(sample)  # warm-up: graph building, allocation
    began = time.perf_counter()
    for _ in range(MEASURE_BATCHES):
        engine.forward(sample)
    return MEASURE_BATCHES * len(sample) / (time.perf_counter() - began)


def _measure(job: JobContext, model: dict[str, Any], ctx: mx.Context) -> dict[str, float]:
    """Both engines' samples/s on this worker, on a seeded batch of the model's input shape."""
    batch = np.random.default_rng(0).random((MEASURE_BATCH_SIZE, *model["input_shape"]),
                                            dtype=np.float32)
    kind = Device.parse(job.device).kind
    speeds = {"mxnet": _rate(mxnet_engine(model, ctx, ""), batch),
              "onnx": _rate(onnx_engine(model, kind, ""), batch)}
    registry.record_engine_speeds(job.url, model["name"], model["version"], kind, speeds)
    model["engines"] = {**(model.get("engines") or {}), kind: speeds}
    return speeds


def pick(job: JobContext, model: dict[str, Any], asked: str, ctx: mx.Context) -> Engine:
    """The engine this job runs on (measuring both first, for `auto`, when no figures exist)."""
    kind = Device.parse(job.device).kind
    if asked == "auto" and (missing := onnx_runtime.unavailable(kind)) is not None:
        return mxnet_engine(model, ctx, missing)
    speeds = (model.get("engines") or {}).get(kind)
    if rule.needs_measuring(asked, model.get("onnx"), speeds):
        speeds = _measure(job, model, ctx)
    choice = rule.choose(asked, model.get("onnx"), speeds)
    if choice.engine == "onnx":
        return onnx_engine(model, kind, choice.reason)
    return mxnet_engine(model, ctx, choice.reason)
