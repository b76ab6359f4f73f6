"""Adding a version from MXNet: a built-in architecture with seeded weights, a user's `net.export()`
files (checked, then their outputs detected), or a finished training's net; each written in
MXNet's export format with its ONNX export beside it, then its row.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxq.db import registry
from mxq.db.fence import Fence
from mxq.db.records import HEADS, ModelRecord
from mxq.errors import reason
from mxq.preprocess import Preprocess
from mxq.tasks.model_store import onnx_export
from mxq.tasks.model_store.checksums import sha256
from mxq.tasks.model_store.locations import publish, store_dir
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.models import probabilities
from mxq.tasks.model_store.mxnet.batch_proof import prove_batches
from mxq.tasks.model_store.mxnet.files import (
    PREFIX,
    check_outputs_count,
    check_params_file,
    check_symbol_file,
    data_name,
    input_dtype,
    open_net,
    symbol_shape,
)
from mxq.tasks.model_store.output_detection import check_output_shape, detect_outputs, heads_of
from mxq.tasks.model_store.version_folder import new_folder
from mxq.tasks.model_store.zoo import build
from mxq.tasks.runtimes.mx import gluon, mx
from mxq.workers.jobs.jobspecs import parse_heads
from mxq.workers.settings import Settings


def _register(settings: Settings, name: str, write: Callable[[Path], None], fields: dict[str, Any],
              preprocess: Preprocess | None = None, fence: Fence | None = None) -> ModelRecord:
    """Write the files of the next version with `write(folder)` and its ONNX export (ending in
    a softmax only for logits), then its row; undo files on failure."""
    url, home = settings.database, settings.home_path
    outputs = fields.setdefault("outputs", "logits")
    preprocess = preprocess or Preprocess()
    preprocess.check(tuple(fields["input_shape"]))
    version = registry.next_version(url, name)
    folder = new_folder(store_dir(home, url, name, version), name, version)
    try:
        write(folder)
        params, symbol = folder / f"{PREFIX}-0000.params", folder / f"{PREFIX}-symbol.json"
        heads = fields.get("heads")
        onnx = onnx_export.export(
            folder, symbol, params, tuple(fields["input_shape"]),
            lambda x: probabilities(open_net(symbol, params, mx.cpu()), mx.cpu(), x, outputs, heads),
            kind=heads or outputs)
        onnx["symbol_sha256"] = sha256(symbol)  # beside the export's own: no column of its own
        publish(settings, url, name, version,
                [symbol, params, *([Path(onnx["file"])] if onnx.get("file") else [])])
        added = registry.add_model(url, {
            **fields, "name": name, "version": version, "params_file": str(params),
            "symbol_file": str(symbol), "checksum": sha256(params), "onnx": onnx,
            "preprocess": preprocess.as_dict(),
        }, fence)
        if added["version"] != version:  # the training registered already: its version stands
            shutil.rmtree(folder, ignore_errors=True)
        return added
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def add_builtin(settings: Settings, name: str, arch: str, input_shape: tuple[int, ...],
                classes: int, seed: int = 0, source: str = "builtin",
                preprocess: Preprocess | None = None) -> ModelRecord:
    """A built-in architecture with random (seeded) weights."""
    net = build(arch, classes, input_shape)
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, *input_shape)))
    return _register(settings, name, lambda folder: net.export(str(folder / PREFIX), 0), {
        "arch": arch, "input_shape": list(input_shape), "classes": classes, "source": source},
        preprocess)


def add_exported(settings: Settings, name: str, symbol: Path, params: Path,
                 input_shape: tuple[int, ...] | None, preprocess: Preprocess | None = None,
                 max_batch: int | None = None, outputs: str = "auto") -> ModelRecord:
    """A user's `net.export()` output, checked by shape inference at the largest batch a job
    may ask (`max_batch`, default MXQ_MAX_BATCH_SIZE) and small ones, then by loading it and
    running one sample; `outputs` (`auto`, or one of OUTPUT_KINDS) says what it outputs, or has
    it detected (`detect_outputs`); NAME=KIND,… names each of several outputs (`heads_of`)."""
    try:
        stated = parse_heads(outputs)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    for f in (symbol, params):
        if not f.is_file():
            raise ModelError(f"{f} does not exist")
    check_symbol_file(symbol)
    check_params_file(params)
    try:
        shape = input_shape or symbol_shape(symbol, data_name(symbol, params))
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"cannot read {symbol.name} / {params.name}: {reason(exc)}") from None
    if shape is None:
        raise ModelError(f"{symbol.name} does not record its input shape; pass --input-shape "
                         "(one sample, e.g. 64 or 3,32,32)")
    net = open_net(symbol, params, mx.cpu())  # loads, runs nothing
    check_outputs_count(name, net.mxq_symbol, stated)
    prove_batches(name, net.mxq_symbol, net.mxq_data, shape,
                  max_batch or settings.max_batch_size)
    try:
        out = net(mx.nd.zeros((1, *shape), dtype=input_dtype(net)))
        mx.nd.waitall()  # MXNet runs asynchronously: its errors surface when the result is read
    except Exception as exc:
        raise ModelError(f"model does not run on input shape {shape}: {reason(exc)}") from None
    fields: dict[str, Any] = {"arch": "symbol", "input_shape": list(shape),
                              "source": f"import:{symbol.name}"}
    if stated is None:
        check_output_shape(out.shape, outputs)
        fields |= {"classes": int(out.shape[1]), "outputs": detect_outputs(net, symbol, shape, outputs)}
    else:
        heads = heads_of(net, shape, stated)
        fields |= {"classes": sum(h["width"] for h in heads), "outputs": HEADS, "heads": heads}

    def write(folder: Path) -> None:
        shutil.copyfile(symbol, folder / f"{PREFIX}-symbol.json")
        shutil.copyfile(params, folder / f"{PREFIX}-0000.params")

    return _register(settings, name, write, fields, preprocess)


def _export(net: gluon.HybridBlock, prefix: Path, input_shape: tuple[int, ...]) -> None:
    """Symbol and weights files; the export traces the net's own compiled graph, which a net
    trained inside a larger graph (tasks.fit.TrainStep) gets only by one forward pass of its own."""
    param = next(iter(net.collect_params().values()))
    net(mx.nd.zeros((1, *input_shape), ctx=param.list_ctx()[0], dtype=param.dtype))
    net.export(str(prefix), 0)


def add_trained(settings: Settings, name: str, net: gluon.HybridBlock, trained: TrainedVersion,
                metrics: dict[str, float | None], job_id: int, fence: Fence | None = None) -> ModelRecord:
    """A new version of `name` from a finished training job, with its validation metrics; with
    the attempt's `fence`, registered only while the job is that attempt's, and once per job."""
    source = (f"train:job-{job_id}" + (f" from {trained.start}" if trained.start else "")
              + (f" arch {trained.code}" if trained.code else ""))
    return _register(settings, name, lambda folder: _export(net, folder / PREFIX, trained.input_shape), {
        "arch": trained.arch, "input_shape": list(trained.input_shape), "classes": trained.classes,
        "outputs": trained.outputs, "source": source, "metrics": metrics}, trained.preprocess, fence)


@dataclass(frozen=True)
class TrainedVersion:
    """What a trained version is, beside its weights: what it was built as, what it takes and
    gives, and how its inputs are scaled (a training --from a version keeps that version's)."""

    arch: str
    input_shape: tuple[int, ...]
    classes: int
    preprocess: Preprocess
    outputs: str = "logits"
    start: str | None = None  # NAME:VERSION, for a training --from that version
    code: str | None = None  # NAME@SHA256: the registered architecture's code it was built from
