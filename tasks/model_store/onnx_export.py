"""Every model version also as ONNX: exported at registration beside its MXNet files, cleaned
so ONNX Runtime can optimize it, and checked against MXNet on a sample batch.

The exporter (`mx.onnx.export_model`) lists the weights as graph inputs, which stops ONNX
Runtime from folding constants (ResNet-18 ran at half MXNet's speed until they were removed);
the graph also gets a final softmax for a model that outputs logits (a model that ends in a
softmax gets an Identity), so both engines hand back probabilities. A model the
exporter cannot convert keeps serving with MXNet, with the reason stored.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mxq.db.records import Head
from mxq.errors import reason
from mxq.tasks.model_store import output_kinds
from mxq.tasks.model_store.checksums import sha256
from mxq.tasks.runtimes import onnx_runtime
from mxq.tasks.runtimes.mx import mx

ONNX_FILE = "model.onnx"
CHECK_BATCH = 16  # samples of the agreement check
# A second, different batch size: an export whose output does not follow its input's batch is
# refused (ONNX Runtime is not run at MXQ_MAX_BATCH_SIZE: that could take gigabytes; the MXNet
# symbol's shapes were inferred at it before the export, tasks.model_store.mxnet.batch_proof.prove_batches).
SECOND_BATCH = 3
OUTPUT = "probabilities"


def missing() -> str | None:
    """Why this install cannot export and check (the exporter needs `onnx`, the check ONNX
    Runtime on the CPU), else None."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        return "the onnx package is not installed (the cpu and gpu extras have it: reinstall mxq with yours)"
    return onnx_runtime.unavailable("cpu")


def clean(path: Path, softmax: bool = True, kinds: list[str] | None = None) -> None:
    """Initializers out of the graph inputs; a softmax over the classes (or, for a model that
    outputs probabilities already, or values, an Identity) as the one output, named OUTPUT. With
    `kinds`, one per output of a graph with several: each output's softmax or Identity, then
    their concatenation as OUTPUT, the one row per sample jobs store (`models.probabilities`)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path))
    graph = model.graph
    weights = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    del graph.input[:]
    graph.input.extend(inputs)
    first = graph.output[0]
    if kinds is None:
        graph.node.append(_ending(first.name, OUTPUT, softmax))
    else:
        ends = [f"{OUTPUT}_{i}" for i in range(len(kinds))]
        graph.node.extend(_ending(o.name, end, kind == "logits")
                          for o, end, kind in zip(graph.output, ends, kinds, strict=True))
        graph.node.append(helper.make_node("Concat", ends, [OUTPUT], axis=1))
    probs = onnx.ValueInfoProto()
    probs.CopyFrom(first)  # the same type and batch; a concatenation's width is left open
    probs.name = OUTPUT
    if kinds is not None:
        probs.type.tensor_type.shape.dim[1].Clear()
    del graph.output[:]
    graph.output.append(probs)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _ending(source: str, target: str, softmax: bool) -> Any:
    from onnx import helper

    return (helper.make_node("Softmax", [source], [target], axis=1) if softmax
            else helper.make_node("Identity", [source], [target]))


class _FixedBatch(Exception):
    """The export's output does not have one row per sample."""


def _follows_batch(sess: Any, input_shape: tuple[int, ...]) -> None:
    """_FixedBatch unless the export's output has one row per sample at two batch sizes."""
    for batch in (CHECK_BATCH, SECOND_BATCH):
        rows = len(onnx_runtime.run(sess, np.zeros((batch, *input_shape), np.float32)))
        if rows != batch:
            raise _FixedBatch(f"the ONNX export's output has {rows} rows for a batch of {batch}: "
                              "it fixes the batch size")


def export(folder: Path, symbol: Path, params: Path, input_shape: tuple[int, ...],
           mxnet_probs: Callable[[NDArray[np.float32]], NDArray[np.float32]],
           kind: str | list[Head] = "logits") -> dict[str, Any]:
    """Export to `folder/model.onnx` (ending in a softmax when the model outputs `kind`
    logits, else in an Identity) and compare with MXNet (`mxnet_probs`, its outputs as jobs
    store them) on a seeded batch: `{"file", "sha256", "max_diff", "argmax_agreement"}`, or
    `{"file": None, "error"}`. `argmax_agreement` is the share of samples that agree as `kind`
    judges it (`output_kinds`), and `max_diff` is relative to the largest value where values
    exceed 1 (regression values, embeddings). The sha256 is verified before the file is served
    (tasks.engines)."""
    if (why := missing()) is not None:
        return {"file": None, "error": why}
    target = folder / ONNX_FILE
    try:
        mx.onnx.export_model(str(symbol), str(params), [(CHECK_BATCH, *input_shape)], [np.float32],
                             str(target), dynamic=True, dynamic_input_shapes=[(None, *input_shape)])
        clean(target, kind == "logits", None if isinstance(kind, str) else [h["kind"] for h in kind])
        sample = np.random.default_rng(0).random((CHECK_BATCH, *input_shape), dtype=np.float32)
        sess = onnx_runtime.session(target)[0]
        _follows_batch(sess, input_shape)
        ours = onnx_runtime.run(sess, sample)
    except _FixedBatch as exc:
        target.unlink(missing_ok=True)
        return {"file": None, "error": str(exc)}
    except Exception as exc:  # the converter raises many types for ops it does not know
        target.unlink(missing_ok=True)
        return {"file": None, "error": f"the ONNX exporter cannot convert it: {reason(exc)}"}
    theirs = mxnet_probs(sample)
    largest = max(1.0, float(np.abs(theirs).max()))
    return {"file": str(target), "sha256": sha256(target),
            "max_diff": float(np.abs(ours - theirs).max()) / largest,
            "argmax_agreement": output_kinds.agreement(kind, ours, theirs),
            "measure": output_kinds.measure(kind)}
