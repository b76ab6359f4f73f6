"""Proof, by MXNet's shape inference alone, that a symbol's output follows its input's batch: a
symbol that fixes its batch to a constant can corrupt memory and crash the process when run.
"""

from __future__ import annotations

import warnings

from mxq.errors import reason
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.runtimes.mx import gluon, mx

# Besides the largest batch a job may ask (MXQ_MAX_BATCH_SIZE), registration infers the output's
# shape at these batch sizes: a symbol that fixes its batch to a constant matches at most one.
TRIAL_BATCHES = (1, 3)
FIXED_BATCH = ("the symbol fixes the batch size (e.g. a reshape to a constant shape); allowed: "
               "symbols whose batch dimension follows the input")


def _output_rows(sym: mx.sym.Symbol, data: str, shape: tuple[int, ...], batch: int) -> int | None:
    """The rows of the output MXNet's shape inference gives for `batch` samples, without running
    anything (a run of a symbol whose batch is fixed can corrupt memory and crash the process);
    None when it cannot tell."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "cannot decide shape" of a partial inference
        _, outputs, _ = sym.infer_shape_partial(**{data: (batch, *shape)})
    first = outputs[0] if outputs else ()
    return int(first[0]) if first and first[0] > 0 else None


def batch_problem(label: str, sym: mx.sym.Symbol, data: str, shape: tuple[int, ...],
                  batch: int) -> str | None:
    """Why `label` cannot serve a batch of `batch` samples of `shape`, or None."""
    try:
        rows = _output_rows(sym, data, shape, batch)
    except Exception as exc:  # MXNetError: an op whose shapes do not fit this batch
        return (f"model {label}: MXNet cannot infer its output shape for a batch of {batch}: "
                f"{reason(exc)}; allowed: symbols whose batch dimension follows the input")
    if rows is None or rows == batch:
        return None
    return f"model {label}: its output has {rows} rows for a batch of {batch}: {FIXED_BATCH}"


def prove_batches(label: str, sym: mx.sym.Symbol, data: str, shape: tuple[int, ...],
                  max_batch: int) -> None:
    """ModelError unless the output follows the input's batch at the largest batch a job may
    ask and at TRIAL_BATCHES, found by shape inference alone (no memory is allocated)."""
    for batch in dict.fromkeys((max_batch, *TRIAL_BATCHES)):
        if (problem := batch_problem(label, sym, data, shape, batch)) is not None:
            raise ModelError(problem)


def check_batch(net: gluon.SymbolBlock, label: str, shape: tuple[int, ...], batch: int) -> None:
    """ModelError before a stored net runs a batch its output would not follow (a version
    registered before registration proved it), so the job fails and not the worker."""
    sym, data = getattr(net, "mxq_symbol", None), getattr(net, "mxq_data", None)
    if sym is not None and data is not None \
            and (problem := batch_problem(label, sym, data, shape, batch)) is not None:
        raise ModelError(problem)
