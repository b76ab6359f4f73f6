"""The model store's loaded nets: a small per-process cache of the versions jobs serve, the batch
outputs they store, and a version's net opened for a training --from it.

Every version is stored in MXNet's export format (`model-symbol.json` + `model-0000.params`), so
one loader (`SymbolBlock.imports`, `mxnet.files.open_net`) serves built-in, imported and trained
models alike; what its output is (`outputs`) says how a batch's outputs are stored
(`output_detection`).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mxq.db.records import Head, ModelRecord
from mxq.engines import onnx_only, plain_onnx
from mxq.tasks.model_store.checksums import verify
from mxq.tasks.model_store.locations import local_file
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.mxnet.files import input_dtype, open_net
from mxq.tasks.runtimes.mx import gluon, mx
from mxq.workers.settings import Settings

CACHE_SIZE = 2  # models kept loaded per worker process; most workers serve one model at a time
# Loaded nets by (name, version, checksum, context).
_cache: OrderedDict[tuple[str, int, str, str], gluon.SymbolBlock] = OrderedDict()


def probabilities(net: gluon.Block, ctx: mx.Context, x: NDArray[np.generic],
                  outputs: str = "logits", heads: list[Head] | None = None) -> NDArray[np.float32]:
    """One batch's outputs as jobs store them, in float32 whatever the net's dtype (a float16 net
    is fed float16): a softmax of logits, any other kind's output as it is (a second softmax of
    probabilities would squash 1.0 to 0.23 over 10 classes); `asnumpy` waits for MXNet, so its
    errors surface here."""
    out = net(mx.nd.array(x, ctx=ctx, dtype=input_dtype(net)))
    if heads:  # several outputs: each as stored, side by side in one row per sample
        return np.concatenate([_as_stored(o, h["kind"]) for o, h in zip(out, heads, strict=True)],
                              axis=1)
    return _as_stored(out, outputs)


def _as_stored(out: mx.nd.NDArray, kind: str) -> NDArray[np.float32]:
    out = out.astype("float32", copy=False)
    probs: NDArray[np.float32] = (mx.nd.softmax(out) if kind == "logits" else out).asnumpy()
    return probs


def load(settings: Settings, model: ModelRecord, ctx: mx.Context) -> tuple[gluon.SymbolBlock, bool]:
    """The loaded, hybridized model and whether it came from this process's cache."""
    key = (model["name"], model["version"], model["checksum"], str(ctx))
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key], True
    net = open_net(*_checked_files(settings, model), ctx)
    net.hybridize(static_alloc=True)
    _cache[key] = net
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return net, False


def _checked_files(settings: Settings, model: ModelRecord) -> tuple[Path, Path]:
    """A version's symbol and params files, present here and as registered (ChangedFile when
    one was swapped)."""
    label = f"{model['name']}:{model['version']}"
    params = local_file(settings, model, model["params_file"])
    if not params.is_file():
        raise ModelError(f"params file {params} of {label} is missing")
    if model["symbol_file"] is None:
        raise ModelError(onnx_only(label) if plain_onnx(model["onnx"])
                         else f"{label} has no symbol file recorded")
    symbol = local_file(settings, model, model["symbol_file"])
    if not symbol.is_file():
        raise ModelError(f"symbol file {symbol} of {label} is missing")
    verify(params, model["checksum"], "params file", label)
    verify(symbol, (model.get("onnx") or {}).get("symbol_sha256"), "symbol file", label)
    return symbol, params


def trainable(settings: Settings, model: ModelRecord, ctxs: list[mx.Context],
              dtype: str) -> gluon.SymbolBlock:
    """A version's own graph with its weights on every training context, in `dtype`, its
    parameters trainable: the start of a training --from it (never the cached serving net)."""
    net = open_net(*_checked_files(settings, model), ctxs[0])
    net.collect_params().reset_ctx(ctxs)
    net.cast(dtype)
    return net


def forget_all() -> int:
    """Drop every loaded net (a worker whose device is leased to a training); how many."""
    count = len(_cache)
    _cache.clear()
    return count
