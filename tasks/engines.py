"""The two inference engines behind one interface, and which one a job gets.

MXNet runs the stored model; ONNX Runtime runs its ONNX export (`tasks.onnx_export`). For
`--engine auto` the first job of a model version on a kind of device measures both engines on a
few batches of its own batch size on that worker's device and stores their samples/s
(`registry.record_engine_speeds`); every later job of that version on that kind reads the choice
(`mxq.engines.choose`).
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
from mxq.db.records import ModelRecord
from mxq.device import Device
from mxq.tasks import onnx_runtime
from mxq.tasks.runner import JobContext, JobInputError
from mxq.workers.settings import get_settings

# Each engine is timed on batches of the job's size (kept between these bounds), after one
# untimed warm-up, for at least MEASURE_BATCHES batches and MEASURE_SECONDS.
MEASURE_BATCHES, MEASURE_SECONDS = 3, 0.3
MEASURE_BATCH_RANGE = (16, 256)


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


def mxnet_engine(model: ModelRecord, device: str, reason: str) -> Engine:
    """MXNet on the worker's device (imported here: a worker serving ONNX only never loads it)."""
    from mxq.tasks.device import context
    from mxq.tasks.models import ModelError, load, probabilities

    ctx = context(device)
    try:
        net, cached = load(model, ctx)
    except ModelError as exc:
        raise JobInputError(str(exc)) from None
    return Engine("mxnet", lambda x: probabilities(net, ctx, x), lambda: _release(net), cached, reason)


def onnx_engine(model: ModelRecord, kind: str, reason: str) -> Engine:
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
    return Engine("onnx", onnx_runtime.runner(sess), lambda: None, cached, reason)


def _rate(engine: Engine, sample: np.ndarray) -> float:
    engine.forward(sample)  # warm-up: graph building, allocation
    began, batches = time.perf_counter(), 0
    while batches < MEASURE_BATCHES or time.perf_counter() - began < MEASURE_SECONDS:
        engine.forward(sample)
        batches += 1
    return batches * len(sample) / (time.perf_counter() - began)


def _measure(job: JobContext, model: ModelRecord, batch_size: int) -> dict[str, float]:
    """Both engines' samples/s on this worker, on a seeded batch of the model's input shape."""
    low, high = MEASURE_BATCH_RANGE
    batch = np.random.default_rng(0).random((min(max(batch_size, low), high), *model["input_shape"]),
                                            dtype=np.float32)
    kind = Device.parse(job.device).kind
    speeds = {"mxnet": _rate(mxnet_engine(model, job.device, ""), batch),
              "onnx": _rate(onnx_engine(model, kind, ""), batch)}
    registry.record_engine_speeds(job.url, model["name"], model["version"], kind, speeds)
    model["engines"] = {**(model.get("engines") or {}), kind: speeds}
    return speeds


def pick(job: JobContext, model: ModelRecord, asked: str, batch_size: int) -> Engine:
    """The engine this job runs on (measuring both first, for `auto`, when no figures exist, on
    batches of `batch_size`). A worker whose GPU MXNet cannot run serves ONNX only."""
    kind = Device.parse(job.device).kind
    mxnet_unusable = get_settings().mxnet_unusable
    if asked == "auto" and mxnet_unusable is None and (missing := onnx_runtime.unavailable(kind)):
        return mxnet_engine(model, job.device, missing)
    speeds = (model.get("engines") or {}).get(kind)
    if mxnet_unusable is None and rule.needs_measuring(asked, model.get("onnx"), speeds):
        try:
            speeds = _measure(job, model, batch_size)
        except Exception as exc:  # one engine could not run here: MXNet serves (or says why not)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return mxnet_engine(model, job.device, f"not measured: {reason}")
    try:
        choice = rule.choose(asked, model.get("onnx"), speeds, mxnet_unusable)
    except rule.NoEngine as exc:
        raise JobInputError(f"{model['name']}:{model['version']} on {job.device}: {exc}") from None
    if choice.engine == "onnx":
        return onnx_engine(model, kind, choice.reason)
    return mxnet_engine(model, job.device, choice.reason)
