"""What an imported version outputs, told from the model itself.

Each version records what its output is (`outputs`, `mxq.db.records.OUTPUT_KINDS`): `logits`,
which mxq turns into class probabilities with a softmax, or `probabilities` (the model ends in a
softmax), used as they are; or, for a model that is not a classifier, `multilabel`, `regression`
or `embedding` values, stored as they come. Built-in and trained versions output logits; an
imported one is told by its symbol's last op or by a trial run (`detect_outputs`), or stated
with `mxq models add --outputs`; the ONNX import (`onnx_import`) judges its trial runs by the
same rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mxq.db.records import CLASSIFIER_OUTPUTS, Head
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.mxnet.files import input_dtype
from mxq.tasks.runtimes.mx import gluon, mx

# A symbol whose last op is one of these outputs probabilities. (log_softmax outputs
# log-probabilities: a softmax of them gives the probabilities back, so they count as logits.)
SOFTMAX_OPS = {"softmax", "SoftmaxOutput", "SoftmaxActivation", "Softmax"}
# Ops that keep values as they are, looked through to find the last op that computes.
PASS_OPS = {"Flatten", "flatten", "Reshape", "reshape", "_copy", "identity", "BlockGrad",
            "stop_gradient", "squeeze", "expand_dims"}
SUM_TOLERANCE = 1e-3  # a row of probabilities sums to 1 within this
TRIAL_SAMPLES = 3  # samples of the trial run (a batch size prove_batches proved)


def _last_op(symbol_file: Path) -> str | None:
    """The op of the symbol's (first) output, looking through ops that only reshape or copy."""
    graph = json.loads(symbol_file.read_text())
    nodes, heads = graph.get("nodes", []), graph.get("heads") or []
    index = heads[0][0] if heads and isinstance(heads[0], list) and heads[0] else None
    while isinstance(index, int) and 0 <= index < len(nodes):
        node = nodes[index]
        if node.get("op") not in PASS_OPS or not node.get("inputs"):
            return str(node.get("op"))
        index = node["inputs"][0][0]
    return None


def look_like_probabilities(out: NDArray[np.float32]) -> bool:
    """Every row non-negative and summing to 1: what a softmax gives on any input."""
    return bool(np.isfinite(out).all() and (out >= 0).all()
                and (np.abs(out.sum(axis=1) - 1) <= SUM_TOLERANCE).all())


def detect_outputs(net: gluon.Block, symbol_file: Path, shape: tuple[int, ...],
                   stated: str = "auto") -> str:
    """What the version outputs. `auto`: `logits` or `probabilities`, told by the symbol's last
    op (a softmax), else a trial run on seeded random inputs whose rows all sum to 1; an output
    of width 1 is no classifier's: `regression`. A stated kind the evidence contradicts is
    refused (the scores would be wrong); a stated kind that is no classifier is taken as said,
    multi-label probabilities once the trial's values all lie in [0, 1]."""
    trial = np.random.default_rng(0).standard_normal((TRIAL_SAMPLES, *shape)).astype(np.float32)
    out = net(mx.nd.array(trial, dtype=input_dtype(net))).astype("float32").asnumpy()
    if stated not in (*CLASSIFIER_OUTPUTS, "auto") or (stated == "auto" and out.shape[1] == 1):
        return value_kind(stated, out)
    op = _last_op(symbol_file)
    if op in SOFTMAX_OPS:
        found = ("probabilities", f"its last op is {op}")
    elif look_like_probabilities(out):
        found = ("probabilities", f"its outputs on {TRIAL_SAMPLES} random samples are rows summing to 1")
    else:
        found = ("logits", f"its last op is {op}, and its outputs are not probabilities")
    if stated in ("auto", found[0]):
        return found[0]
    if stated == "probabilities":
        raise ModelError(f"--outputs probabilities: the model's outputs on {TRIAL_SAMPLES} random "
                         f"samples are not probabilities (row sums {row_sums(out)}, smallest value "
                         f"{out.min():.4g}); allowed: --outputs logits or auto")
    raise ModelError(f"--outputs logits: the model outputs probabilities ({found[1]}), and a "
                     "softmax of them would squash every score; allowed: --outputs probabilities "
                     "or auto")


def value_kind(stated: str, out: NDArray[np.float32]) -> str:
    """A kind that is no classifier's (`auto` of a width-1 output: regression), once the trial
    outputs fit it."""
    kind = "regression" if stated == "auto" else stated
    if kind == "multilabel" and not (np.isfinite(out).all() and (out >= 0).all() and (out <= 1).all()):
        raise ModelError(f"--outputs multilabel: the model's outputs on {TRIAL_SAMPLES} random "
                         f"samples lie in [{out.min():.4g}, {out.max():.4g}], not in [0, 1] (end the "
                         "net in a sigmoid); allowed: --outputs regression or embedding for raw values")
    return kind


def row_sums(out: NDArray[np.float32]) -> str:
    return ", ".join(f"{v:.4g}" for v in out.sum(axis=1))


def heads_of(net: gluon.Block, shape: tuple[int, ...], stated: list[tuple[str, str]]) -> list[Head]:
    """Each of several outputs, as `--outputs NAME=KIND,…` names them in order, with its width
    and its kind (`auto`: probabilities whose rows sum to 1, regression for a width of 1, else
    logits), each checked on a trial run as one output is."""
    trial = np.random.default_rng(0).standard_normal((TRIAL_SAMPLES, *shape)).astype(np.float32)
    outs = net(mx.nd.array(trial, dtype=input_dtype(net)))
    heads: list[Head] = []
    for (name, kind), raw in zip(stated, outs, strict=True):
        out = raw.astype("float32").asnumpy()
        if kind == "auto":
            kind = ("regression" if out.ndim == 2 and out.shape[1] == 1 else
                    "probabilities" if out.ndim == 2 and look_like_probabilities(out) else "logits")
        try:
            check_output_shape((1, *out.shape[1:]), kind)
            if kind not in CLASSIFIER_OUTPUTS:
                kind = value_kind(kind, out)
            elif kind == "probabilities" and not look_like_probabilities(out):
                raise ModelError(f"its rows do not sum to 1 (row sums {row_sums(out)})")
        except ModelError as exc:
            raise ModelError(f"--outputs {name}={kind}: output {name}: {exc}") from None
        heads.append({"name": name, "kind": kind, "width": int(out.shape[1])})
    return heads


def check_output_shape(shape: tuple[int, ...], outputs: str) -> None:
    """One row per sample: (1, classes) for a classifier (at least 2), (1, width) otherwise."""
    least = 2 if outputs in CLASSIFIER_OUTPUTS else 1
    if len(shape) != 2 or shape[0] != 1 or shape[1] < least:
        want = "(batch, classes), 2 classes or more" if least == 2 else "(batch, values)"
        raise ModelError(f"model output has shape {shape} for one sample; mxq expects {want}"
                         + ("" if least == 1 else ", or --outputs regression for one value"))
