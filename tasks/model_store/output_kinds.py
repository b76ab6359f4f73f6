"""How two runs of one version agree, by what the version outputs (`mxq.db.records.OUTPUT_KINDS`).

A classifier's runs agree on a sample when they pick the same class. Other outputs have no
argmax that means anything, so each kind gets a per-sample test that fits it, and agreement is
the share of samples that pass it: the same number a job's `--min-agreement` and a variant's
bound already speak of (a share of samples), whatever the kind.
- multilabel: the same set of labels at or above LABEL_THRESHOLD;
- embedding: cosine similarity at least MIN_COSINE (the direction is what a search index uses);
- regression: every value within MAX_RELATIVE of the float32 one, relative to its magnitude or,
  for values near zero, to the output's typical magnitude (a relative error of 0.001 around 0
  says nothing).
Used where a variant is judged (`variants.compare`, `engines.vetted`) and where the ONNX export
is checked against MXNet (`onnx_export.export`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mxq.db.records import CLASSIFIER_OUTPUTS, HEADS, Head, ModelRecord

LABEL_THRESHOLD = 0.5
MIN_COSINE = 0.99
MAX_RELATIVE = 0.01

Values = NDArray[np.float32]


def _per_sample(kind: str, ours: Values, theirs: Values) -> NDArray[np.bool_]:
    """Whether each sample of `ours` agrees with `theirs` (float32's), as `kind` judges it."""
    if kind in CLASSIFIER_OUTPUTS:
        same: NDArray[np.bool_] = ours.argmax(axis=1) == theirs.argmax(axis=1)
        return same
    if kind == "multilabel":
        tags: NDArray[np.bool_] = ((ours >= LABEL_THRESHOLD) == (theirs >= LABEL_THRESHOLD)).all(axis=1)
        return tags
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    if kind == "embedding":
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        cosine = np.where(norms > 0, (a * b).sum(axis=1) / np.where(norms > 0, norms, 1.0),
                          np.all(a == b, axis=1).astype(np.float64))
        close: NDArray[np.bool_] = cosine >= MIN_COSINE
        return close
    typical = float(np.abs(b).mean()) if b.size else 0.0
    scale = np.maximum(np.abs(b), max(typical, 1e-12))
    within: NDArray[np.bool_] = (np.abs(a - b) <= MAX_RELATIVE * scale).all(axis=1)
    return within


def heads_of(model: ModelRecord) -> list[Head]:
    """A version's outputs in order: its several heads, or its one output (named `output`)."""
    return list(model.get("heads") or []) or [
        {"name": "output", "kind": model.get("outputs") or "logits", "width": model["classes"]}]


def columns(heads: list[Head]) -> list[tuple[Head, slice]]:
    """Each head with the columns of a job's row that hold it (heads side by side, in order)."""
    spans, at = [], 0
    for head in heads:
        spans.append((head, slice(at, at + head["width"])))
        at += head["width"]
    return spans


def agreement(kind: str | list[Head], ours: Values, theirs: Values) -> float:
    """The share of samples on which `ours` agrees with `theirs` (float32's), in [0, 1]; for
    several heads, a sample agrees when every head does."""
    if not len(ours):
        return 1.0
    if isinstance(kind, str):
        return float(_per_sample(kind, ours, theirs).mean())
    every = np.ones(len(ours), dtype=bool)
    for head, span in columns(kind):
        every &= _per_sample(head["kind"], ours[:, span], theirs[:, span])
    return float(every.mean())


def judged(model: ModelRecord) -> str | list[Head]:
    """What `agreement` judges a version's outputs by: its kind, or its heads."""
    if model.get("outputs") == HEADS:
        return heads_of(model)
    return model.get("outputs") or "logits"


def measure(kind: str | list[Head]) -> str:
    """What `agreement` counts for `kind` (or each of several heads), in words for figures and
    errors."""
    if not isinstance(kind, str):
        return "samples on which every output agrees: " + "; ".join(
            f"{h['name']}: {measure(h['kind'])}" for h in kind)
    if kind in CLASSIFIER_OUTPUTS:
        return "argmax agreement"
    if kind == "multilabel":
        return f"samples with the same labels at {LABEL_THRESHOLD}"
    if kind == "embedding":
        return f"samples with cosine similarity at least {MIN_COSINE}"
    return f"samples within {MAX_RELATIVE:.0%} relative difference"
