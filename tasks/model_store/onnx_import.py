"""A plain ONNX file made elsewhere (`torch.onnx.export`, skl2onnx, `onnx.helper`) registered as
a version (`mxq models add NAME --onnx FILE.onnx`).

Such a version has no MXNet graph: ONNX Runtime alone serves it (`mxq.engines.plain_onnx`), and a
training cannot start from it. It is checked as every version is, without MXNet: the file is an
ONNX model, one float32 input of a fixed per-sample shape whose batch is dynamic (a batch fixed
to 1, as `torch.onnx.export` writes without `dynamic_axes`, is made dynamic), one output of shape
(batch, classes), and a trial run by ONNX Runtime on the CPU at batch 1 and 3 whose rows follow
the batch and are finite. Logits or probabilities are told as for MXNet (a last Softmax, or rows
summing to 1). The user's file is kept as given (`imported.onnx`, its sha256 the version's
checksum); what jobs run is `model.onnx`, the graph as the export writes its own: weights out of
the inputs, a softmax appended for logits (an Identity for probabilities), so every engine hands
back probabilities; it is compared with the user's graph run by hand before it is stored.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from mxq.db import registry
from mxq.db.records import CLASSIFIER_OUTPUTS, OUTPUT_KINDS, ModelRecord
from mxq.engines import MAX_DIFF
from mxq.errors import reason
from mxq.json_types import JsonObject
from mxq.preprocess import Preprocess
from mxq.tasks.model_store import onnx_export, output_kinds
from mxq.tasks.model_store.checksums import sha256
from mxq.tasks.model_store.locations import publish, store_dir
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.mxnet.batch_proof import TRIAL_BATCHES
from mxq.tasks.model_store.output_detection import (
    SOFTMAX_OPS,
    TRIAL_SAMPLES,
    look_like_probabilities,
    row_sums,
    value_kind,
)
from mxq.tasks.model_store.version_folder import new_folder
from mxq.workers.settings import Settings

if TYPE_CHECKING:  # imported where they run: a worker that serves MXNet only never loads them
    from onnx import ModelProto, ValueInfoProto
    from onnxruntime import InferenceSession

IMPORTED_FILE = "imported.onnx"  # the user's file as given, beside the served model.onnx
BATCH = "batch"  # the name of the dynamic batch dimension
# The standard opset given to a graph of ai.onnx.ml ops alone (skl2onnx writes some), for the
# Softmax or Identity appended: 11 runs in IR version 6 and up, and its Softmax over axis 1 of
# (batch, classes) is the one of later opsets.
DEFAULT_OPSET = 11
QUIET = 4  # ONNX Runtime's log severity: fatal only (its coloured error line preceded mxq's one line)
PASS_OPS = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"}  # looked through


def _load(path: Path) -> ModelProto:
    """The ONNX model in `path`, checked (ModelError naming the file and why)."""
    import onnx

    if not path.is_file():
        raise ModelError(f"{path} does not exist")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:  # DecodeError, ValidationError, ...: the file is not a valid model
        raise ModelError(f"{path.name} is not a valid ONNX model: {reason(exc)}") from None
    return model


def _dims(value: ValueInfoProto) -> list[int | None]:
    """A value's dimensions: sizes, None where dynamic or unknown."""
    shape = value.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in shape.dim]


def _the_input(model: ModelProto, path: Path) -> ValueInfoProto:
    """The graph's one float32 input (initializers listed as inputs are weights, not inputs)."""
    from onnx import TensorProto

    weights = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in weights]
    if len(inputs) != 1:
        raise ModelError(f"{path.name} has {len(inputs)} inputs ({_names(inputs)}); "
                         "mxq serves models with exactly one input")
    data: ValueInfoProto = inputs[0]
    if data.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise ModelError(f"{path.name}: input {data.name} is not a float32 tensor; allowed: one "
                         "float32 input of shape (batch, ...)")
    return data


def sample_shape(data: ValueInfoProto, path: Path, given: tuple[int, ...] | None) -> tuple[int, ...]:
    """One sample's shape: the input's dimensions after the batch (dynamic or 1), or `given`
    (--input-shape) where the graph leaves some open; a `given` the graph contradicts is refused."""
    dims = _dims(data)
    if len(dims) < 2:  # (onnx.checker requires a graph input's shape to be recorded)
        raise ModelError(f"{path.name}: input {data.name} has rank {len(dims)}; allowed: an input "
                         "of rank 2 or more whose first dimension is the batch")
    if dims[0] not in (None, 1):
        raise ModelError(f"{path.name}: input {data.name} fixes the batch to {dims[0]}; allowed: "
                         "a dynamic batch dimension (or 1)")
    graph = dims[1:]
    if given is None:
        if None in graph:
            raise ModelError(f"{path.name}: input {data.name} has open dimensions "
                             f"{_shown(graph)} after the batch; pass --input-shape (one sample)")
        return tuple(int(d) for d in graph if d is not None)
    if len(given) != len(graph) or any(g is not None and g != v for g, v in zip(graph, given, strict=True)):
        raise ModelError(f"--input-shape {','.join(map(str, given))}: {path.name} takes one sample of "
                         f"shape {_shown(graph)}; allowed: that shape (? is yours to give)")
    return given


def _names(values: Sequence[ValueInfoProto]) -> str:
    """The first few values' names, for a one-line error."""
    return ", ".join(v.name for v in values[:5]) + (", ..." if len(values) > 5 else "") or "none"


def _shown(dims: list[int | None]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


# Converters' classifier nodes (ai.onnx.ml, as skl2onnx and onnxmltools write them) and ZipMap:
# where the class labels are kept.
LABEL_ATTRIBUTES = ("classlabels_int64s", "classlabels_ints", "classlabels_strings")


def _is_tensor(value: ValueInfoProto, rank: int | None = None) -> bool:
    kind = value.type.tensor_type
    known = kind.HasField("shape")
    return value.type.HasField("tensor_type") and (rank is None or not known or len(kind.shape.dim) == rank)


def _class_labels(model: ModelProto) -> list[int | str] | None:
    """The class labels a converter's classifier (or its ZipMap) names, in the order of the
    probability columns; None when the graph names none."""
    from onnx import helper

    for node in reversed(model.graph.node):
        for attr in node.attribute:
            if attr.name in LABEL_ATTRIBUTES:
                found = helper.get_attribute_value(attr)
                return [v.decode() if isinstance(v, bytes) else int(v) for v in found]
    return None


def _unzipped(model: ModelProto, out: ValueInfoProto) -> ValueInfoProto:
    """A ZipMap's output (a sequence of maps, label -> probability) replaced by its input, the
    probability tensor the classifier made: the node goes, the tensor becomes the output."""
    from onnx import TensorProto, helper

    node = next((n for n in model.graph.node if n.op_type == "ZipMap" and out.name in n.output), None)
    if node is None:
        return out
    model.graph.node.remove(node)
    return helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, [BATCH, None])


def _exported_classifier(model: ModelProto) -> list[int | str] | None:
    """A classifier as converters export it (skl2onnx, onnxmltools): a label output (integers or
    strings, rank 1) beside its probabilities (a tensor, or ZipMap's maps). The graph is left
    with the probabilities alone, the one output mxq serves; the class labels, if it names any.
    Any other graph is left as it is (and `_the_output` judges it)."""
    if len(model.graph.output) < 2:
        return None
    labels = _class_labels(model)  # before ZipMap, which may be where they are, goes
    outputs = [_unzipped(model, o) for o in model.graph.output]
    floats = [o for o in outputs if _is_tensor(o, 2) and o.type.tensor_type.elem_type == 1]
    predicted = [o for o in outputs if _is_tensor(o) and o.type.tensor_type.elem_type in (7, 8)]
    if len(floats) != 1 or len(predicted) + 1 != len(outputs):
        return None
    del model.graph.output[:]
    model.graph.output.append(floats[0])
    return labels


def _the_output(model: ModelProto, path: Path) -> ValueInfoProto:
    """The graph's one output, a tensor of rank 2 where the graph records its rank."""
    outputs = list(model.graph.output)
    if len(outputs) != 1:
        raise ModelError(f"{path.name} has {len(outputs)} outputs ({_names(outputs)}); "
                         "mxq needs exactly one, of shape (batch, classes)")
    out: ValueInfoProto = outputs[0]
    if not out.type.HasField("tensor_type"):
        raise ModelError(f"{path.name}: output {out.name} is not a tensor; mxq needs one of shape "
                         "(batch, classes)")
    if out.type.tensor_type.HasField("shape") and len(out.type.tensor_type.shape.dim) != 2:
        raise ModelError(f"{path.name}: output {out.name} has rank "
                         f"{len(out.type.tensor_type.shape.dim)}; mxq needs (batch, classes)")
    return out


def _dynamic_batch(model: ModelProto, data: ValueInfoProto, out: ValueInfoProto) -> None:
    """The input's and output's first dimension made dynamic (a graph exported at batch 1 serves
    any batch where its ops allow; the trial run says whether they do). Shapes inferred for
    values in between are dropped: they may say batch 1."""
    for value in (data, out):
        dims = value.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = BATCH
    del model.graph.value_info[:]


def _rename_output(model: ModelProto, out: ValueInfoProto) -> None:
    """An output named as the served graph's own (`probabilities`) renamed, so the softmax (or
    Identity) appended after it has a name of its own."""
    old, new = out.name, f"{out.name}_imported"
    for node in model.graph.node:
        node.output[:] = [new if n == old else n for n in node.output]
        node.input[:] = [new if n == old else n for n in node.input]
    out.name = new


def _session(model: ModelProto, path: Path) -> InferenceSession:
    """An ONNX Runtime session (CPU) on the graph in memory, or ModelError naming the file."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = QUIET
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # an op or type ONNX Runtime does not run
        raise ModelError(f"ONNX Runtime cannot load {path.name}: {reason(exc)}") from None


def _run_bounded(sess: InferenceSession, feed: dict[str, NDArray[np.float32]], seconds: float
                 ) -> list[NDArray[np.float32]]:
    """`sess.run` stopped after `seconds` (a Loop of 2^62 turns would run for ever): ONNX Runtime
    checks its run options' terminate flag between nodes and loop turns. TimeoutError then."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = QUIET
    timer = threading.Timer(seconds, setattr, (options, "terminate", True))
    timer.daemon = True
    timer.start()
    try:
        outputs: list[NDArray[np.float32]] = sess.run(None, feed, options)
        return outputs
    except Exception:
        if options.terminate:
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()


def _trial(sess: InferenceSession, path: Path, shape: tuple[int, ...], seconds: float) -> NDArray[np.float32]:
    """The output on seeded random samples at each trial batch, each within `seconds`, checked:
    one finite row of the same width per sample (a classifier's at least 2 classes: `detect`).
    The last batch's output."""
    name, out, classes = sess.get_inputs()[0].name, np.zeros((0, 0), np.float32), None
    for batch in TRIAL_BATCHES:
        x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
        try:
            out = np.asarray(_run_bounded(sess, {name: x}, seconds)[0], dtype=np.float32)
        except TimeoutError:
            raise ModelError(f"{path.name} ran for more than {seconds:g} s on a batch of {batch} "
                             "samples and was stopped (MXQ_MODEL_TRIAL_SECONDS); allowed: a graph "
                             "whose trial finishes (a Loop with a bounded trip count)") from None
        except Exception as exc:  # ONNX Runtime's errors: an op that cannot take this batch or shape
            raise ModelError(f"{path.name} does not run on a batch of {batch} samples of shape {shape}: "
                             f"{reason(exc)}") from None
        if out.ndim != 2 or out.shape[0] != batch or out.shape[1] < 1 or classes not in (None, out.shape[1]):
            raise ModelError(f"{path.name}: its output has shape {out.shape} for a batch of {batch}; "
                             "mxq needs (batch, width), following the batch")
        if not np.isfinite(out).all():
            raise ModelError(f"{path.name}: its output on {batch} random samples holds NaN or inf; "
                             "allowed: finite outputs")
        classes = out.shape[1]
    return out


def _last_op(model: ModelProto, out: ValueInfoProto) -> str | None:
    """The op that computes the output, looking through ops that only reshape or copy."""
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers.get(out.name)
    while node is not None and node.op_type in PASS_OPS and node.input:
        node = producers.get(node.input[0])
    return None if node is None else str(node.op_type)


def detect(model: ModelProto, out: ValueInfoProto, trial: NDArray[np.float32], stated: str) -> str:
    """What the graph outputs, as `output_detection.detect_outputs` tells it for MXNet: `logits` or
    `probabilities` by a last Softmax, else trial rows summing to 1 (a stated kind the evidence
    contradicts is refused); a kind that is no classifier's as stated (`output_detection.value_kind`), and
    `regression` for `auto` of an output of width 1."""
    if stated not in (*CLASSIFIER_OUTPUTS, "auto") or (stated == "auto" and trial.shape[1] == 1):
        return value_kind(stated, trial)
    if trial.shape[1] < 2:
        raise ModelError(f"--outputs {stated}: the output has width 1, and a classifier has 2 classes "
                         "or more; allowed: --outputs regression or auto")
    op = _last_op(model, out)
    if op in SOFTMAX_OPS or look_like_probabilities(trial):
        found = "probabilities"
    else:
        found = "logits"
    if stated in ("auto", found):
        return found
    if stated == "probabilities":
        raise ModelError(f"--outputs probabilities: the model's outputs on {TRIAL_SAMPLES} random "
                         f"samples are not probabilities (row sums {row_sums(trial)}, smallest value "
                         f"{trial.min():.4g}); allowed: --outputs logits or auto")
    raise ModelError(f"--outputs logits: the model outputs probabilities (last op {op}, or rows "
                     "summing to 1), and a softmax of them would squash every score; allowed: "
                     "--outputs probabilities or auto")


def _softmax(x: NDArray[np.float32]) -> NDArray[np.float32]:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    probs: NDArray[np.float32] = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    return probs


def _served(folder: Path, path: Path, model: ModelProto, kind: str, shape: tuple[int, ...]) -> JsonObject:
    """Write the graph jobs run (`model.onnx`, ending in probabilities) and compare it with the
    user's graph run by hand (a softmax applied for logits): the `onnx` record of the version."""
    import onnx

    from mxq.tasks.runtimes import onnx_runtime

    target = folder / onnx_export.ONNX_FILE
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):  # ai.onnx.ml ops alone
        model.opset_import.append(onnx.helper.make_opsetid("", DEFAULT_OPSET))
    try:
        onnx.save(model, str(target))
        onnx_export.clean(target, softmax=kind == "logits")
    except Exception as exc:  # the checker refuses the graph with its final op (an opset it lacks)
        last = "Softmax" if kind == "logits" else "Identity"
        raise ModelError(f"{path.name}: mxq cannot end its graph in a {last} to serve it: "
                         f"{reason(exc)}") from None
    sample = np.random.default_rng(0).random((onnx_export.CHECK_BATCH, *shape), dtype=np.float32)
    sess = _session(model, path)
    theirs = np.asarray(sess.run(None, {sess.get_inputs()[0].name: sample})[0], dtype=np.float32)
    theirs = _softmax(theirs) if kind == "logits" else theirs
    ours = onnx_runtime.run(onnx_runtime.session(target)[0], sample)
    diff = float(np.abs(ours - theirs).max()) / max(1.0, float(np.abs(theirs).max()))
    agreement = output_kinds.agreement(kind, ours, theirs)
    if diff > MAX_DIFF or agreement < 1.0:
        raise ModelError(f"the stored graph disagrees with the file run by hand (max diff {diff:.2g}, "
                         f"{output_kinds.measure(kind)} {agreement:.2%})")
    return {"file": str(target), "sha256": sha256(target), "max_diff": diff,
            "argmax_agreement": agreement, "measure": output_kinds.measure(kind), "imported": True}


def add_onnx(settings: Settings, name: str, path: Path, input_shape: tuple[int, ...] | None,
             preprocess: Preprocess | None = None, outputs: str = "auto") -> ModelRecord:
    """Register `path` as the next version of `name` (arch `onnx`, no symbol file), after its
    checks and trial run; `outputs` (`auto`, or one of OUTPUT_KINDS) as for an MXNet file."""
    if outputs not in ("auto", *OUTPUT_KINDS):
        raise ModelError(f"--outputs {outputs!r}: allowed: auto, {', '.join(OUTPUT_KINDS)}")
    if (missing := onnx_export.missing()) is not None:
        raise ModelError(f"cannot import {path.name} here: {missing}")
    model = _load(path)
    labels = _exported_classifier(model)
    data, out = _the_input(model, path), _the_output(model, path)
    shape = sample_shape(data, path, input_shape)
    _dynamic_batch(model, data, out)
    if out.name == onnx_export.OUTPUT:
        _rename_output(model, out)
    trial = _trial(_session(model, path), path, shape, settings.model_trial_seconds)
    kind = detect(model, out, trial, outputs)
    preprocess = preprocess or Preprocess()
    preprocess.check(shape)
    return _store(settings, name, path, model, (kind, shape), {
        "arch": "onnx", "input_shape": list(shape), "classes": int(trial.shape[1]),
        "source": f"onnx:{path.name}"[:256], "outputs": kind, "preprocess": preprocess.as_dict()},
        labels)


def _store(settings: Settings, name: str, path: Path, model: ModelProto,
           served: tuple[str, tuple[int, ...]], fields: JsonObject,
           labels: list[int | str] | None = None) -> ModelRecord:
    """The version's folder (the user's file, the served graph), uploaded to a bucket store,
    then its row (the converter's class labels, if any, in its `onnx` record: column i of the
    probabilities is `class_labels[i]`); files undone on failure. `served`: what the version
    outputs and one sample's shape, as `fields` records them."""
    url = settings.database
    version = registry.next_version(url, name)
    folder = new_folder(store_dir(settings.home_path, url, name, version), name, version)
    try:
        kept = folder / IMPORTED_FILE
        shutil.copyfile(path, kept)
        onnx = _served(folder, path, model, *served)
        if labels is not None:
            onnx["class_labels"] = [*labels]
        publish(settings, url, name, version, [kept, Path(str(onnx["file"]))])
        added = registry.add_model(url, {**fields, "name": name, "version": version,
                                         "params_file": str(kept), "symbol_file": None,
                                         "checksum": sha256(kept), "onnx": onnx})
        if added["version"] != version:
            shutil.rmtree(folder, ignore_errors=True)
        return added
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
