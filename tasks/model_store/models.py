"""The model store: built-in and imported models on disk, and a small per-process cache of loaded ones.

Every version is stored in MXNet's export format (`model-symbol.json` + `model-0000.params`), so
one loader (`SymbolBlock.imports`) serves built-in, imported and trained models alike.

Each version also records what its output is (`outputs`, `mxq.db.records.OUTPUT_KINDS`): `logits`,
which mxq turns into class probabilities with a softmax, or `probabilities` (the model ends in a
softmax), used as they are; or, for a model that is not a classifier, `multilabel`, `regression`
or `embedding` values, stored as they come. Built-in and trained versions output logits; an
imported one is told by its symbol's last op or by a trial run (`detect_outputs`), or stated
with `mxq models add --outputs`.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mxq.db import registry
from mxq.db.fence import Fence
from mxq.db.records import CLASSIFIER_OUTPUTS, HEADS, Head, ModelRecord
from mxq.engines import onnx_only, plain_onnx
from mxq.errors import UserError, reason
from mxq.preprocess import Preprocess
from mxq.tasks.model_store import onnx_export
from mxq.tasks.model_store.checksums import sha256, verify
from mxq.tasks.model_store.locations import local_file, publish, store_dir
from mxq.tasks.model_store.zoo import build
from mxq.tasks.runtimes.mx import DeviceFault, device_fault, gluon, mx
from mxq.workers.jobs.jobspecs import parse_heads
from mxq.workers.settings import Settings

CACHE_SIZE = 2  # models kept loaded per worker process; most workers serve one model at a time
PREFIX = "model"
# Besides the largest batch a job may ask (MXQ_MAX_BATCH_SIZE), registration infers the output's
# shape at these batch sizes: a symbol that fixes its batch to a constant matches at most one.
TRIAL_BATCHES = (1, 3)
FIXED_BATCH = ("the symbol fixes the batch size (e.g. a reshape to a constant shape); allowed: "
               "symbols whose batch dimension follows the input")
# Loaded nets by (name, version, checksum, context).
_cache: OrderedDict[tuple[str, int, str, str], gluon.SymbolBlock] = OrderedDict()
# A symbol whose last op is one of these outputs probabilities. (log_softmax outputs
# log-probabilities: a softmax of them gives the probabilities back, so they count as logits.)
SOFTMAX_OPS = {"softmax", "SoftmaxOutput", "SoftmaxActivation", "Softmax"}
# Ops that keep values as they are, looked through to find the last op that computes.
PASS_OPS = {"Flatten", "flatten", "Reshape", "reshape", "_copy", "identity", "BlockGrad",
            "stop_gradient", "squeeze", "expand_dims"}
SUM_TOLERANCE = 1e-3  # a row of probabilities sums to 1 within this
TRIAL_SAMPLES = 3  # samples of the trial run (a batch size prove_batches proved)


class ModelError(UserError):
    """A model that cannot be stored or loaded; the message says which file and why."""


LEFTOVER_SECONDS = 120.0  # a version folder with no row, older than this, is a crashed add's


def _new_folder(folder: Path, name: str, version: int) -> Path:
    """The empty folder of a new version. One left by an add that died before its row (older
    than LEFTOVER_SECONDS) is cleared; a younger one is a concurrent add's: a conflict."""
    try:
        folder.mkdir(parents=True)
        return folder
    except FileExistsError:
        if time.time() - folder.stat().st_mtime < LEFTOVER_SECONDS:
            raise registry.ModelConflict(f"model {name} version {version} is being added by "
                                         "another command; add it again in a moment") from None
    shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _register(settings: Settings, name: str, write: Any, fields: dict[str, Any],
              preprocess: Preprocess | None = None, fence: Fence | None = None) -> ModelRecord:
    """Write the files of the next version with `write(folder)` and its ONNX export (ending in
    a softmax only for logits), then its row; undo files on failure."""
    url, home = settings.database, settings.home_path
    outputs = fields.setdefault("outputs", "logits")
    preprocess = preprocess or Preprocess()
    preprocess.check(tuple(fields["input_shape"]))
    version = registry.next_version(url, name)
    folder = _new_folder(store_dir(home, url, name, version), name, version)
    try:
        write(folder)
        params, symbol = folder / f"{PREFIX}-0000.params", folder / f"{PREFIX}-symbol.json"
        heads = fields.get("heads")
        onnx = onnx_export.export(
            folder, symbol, params, tuple(fields["input_shape"]),
            lambda x: probabilities(_open(symbol, params, mx.cpu()), mx.cpu(), x, outputs, heads),
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


def _symbol_shape(symbol_file: Path, data: str) -> tuple[int, ...] | None:
    """The input shape recorded in the symbol (`__shape__` of the data node), when there is one."""
    for node in json.loads(symbol_file.read_text()).get("nodes", []):
        shape = node.get("attrs", {}).get("__shape__")
        if node.get("op") == "null" and node.get("name") == data and shape:
            dims = tuple(int(d) for d in shape.strip("()[] ").split(",") if d.strip())
            return dims[1:] if len(dims) > 1 else None
    return None


def _data_name(symbol_file: Path, params_file: Path) -> str:
    sym = mx.sym.load(str(symbol_file))
    stored = {k.split(":", 1)[-1] for k in mx.nd.load(str(params_file))}
    inputs = [a for a in sym.list_inputs() if a not in stored]
    if len(inputs) == 1:
        return str(inputs[0])
    if "data" in inputs:  # the usual input name: the rest are weights the params file lacks
        missing = ", ".join(a for a in inputs if a != "data")
        raise ModelError(f"params file {params_file.name} does not match symbol {symbol_file.name}: "
                         f"it has no values for {missing}")
    raise ModelError(f"symbol {symbol_file.name} needs {len(inputs)} inputs not in {params_file.name} "
                     f"({', '.join(inputs) or 'none'}); mxq serves models with exactly one input")


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


def _weights_dtype(net: gluon.Block) -> str:
    return np.dtype(next(iter(net.collect_params().values())).dtype).name


def input_dtype(net: gluon.Block) -> str:
    """The dtype a batch must have for `net`: that of its weights (float16 or float32), noted on
    a stored net when it is opened (so not looked up on every batch)."""
    return getattr(net, "mxq_input_dtype", None) or _weights_dtype(net)


def probabilities(net: gluon.Block, ctx: mx.Context, x: NDArray[Any],
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


def _look_like_probabilities(out: NDArray[np.float32]) -> bool:
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
    elif _look_like_probabilities(out):
        found = ("probabilities", f"its outputs on {TRIAL_SAMPLES} random samples are rows summing to 1")
    else:
        found = ("logits", f"its last op is {op}, and its outputs are not probabilities")
    if stated in ("auto", found[0]):
        return found[0]
    if stated == "probabilities":
        raise ModelError(f"--outputs probabilities: the model's outputs on {TRIAL_SAMPLES} random "
                         f"samples are not probabilities (row sums {_sums(out)}, smallest value "
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


def _sums(out: NDArray[np.float32]) -> str:
    return ", ".join(f"{v:.4g}" for v in out.sum(axis=1))


def _open(symbol_file: Path, params_file: Path, ctx: mx.Context) -> gluon.SymbolBlock:
    """The stored net on `ctx`. Weights saved in float16 (a net trained with `--dtype float16`)
    stay so on a GPU, which is then fed float16 batches; on a CPU the net is cast to float32,
    since MXNet's CPU kernels (FullyConnected, Convolution) have no float16."""
    try:
        data = _data_name(symbol_file, params_file)
        with warnings.catch_warnings():  # the input's type is set by the first batch: not news
            warnings.filterwarnings("ignore", "Cannot decide type", UserWarning)
            net = gluon.SymbolBlock.imports(str(symbol_file), [data], str(params_file), ctx=ctx)
    except ModelError:
        raise
    except Exception as exc:  # MXNetError, AssertionError, ValueError from a mismatched pair
        if device_fault(exc):  # the device's, not the files': a faulty GPU is no user's mismatch
            raise DeviceFault(f"the device ({ctx}) failed while loading the model: {reason(exc)}") from None
        raise ModelError(f"params file {params_file.name} does not match symbol "
                         f"{symbol_file.name}: {reason(exc)}") from None
    dtype = _weights_dtype(net)
    if ctx.device_type == "cpu" and dtype != "float32":
        net.cast("float32")
        dtype = "float32"
    net.mxq_input_dtype = dtype
    net.mxq_symbol, net.mxq_data = mx.sym.load(str(symbol_file)), data  # for check_batch
    return net


PARAMS_MAGIC = 0x112  # MXNet's NDArray-list files start with it (then 8 reserved bytes, a count)


def _check_params_file(path: Path) -> None:
    """A params file as MXNet writes one, judged from its header: MXNet itself answers a random
    file with a traceback and one claiming 2**63 arrays with std::bad_alloc."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(24)
    if len(head) < 24 or struct.unpack("<Q", head[:8])[0] != PARAMS_MAGIC:
        raise ModelError(f"params file {path.name} is not an MXNet params file: it does not start "
                         f"with MXNet's NDArray-list header (found {head[:8]!r}, {size} bytes)")
    count = struct.unpack("<Q", head[16:24])[0]
    if count * 16 > size:  # each array's header alone takes more than 16 bytes
        raise ModelError(f"params file {path.name} claims {count} arrays in {size} bytes: it is "
                         "cut short or corrupt")


def _check_symbol_file(path: Path) -> None:
    """A symbol file is the JSON graph `net.export()` writes (`nodes`, `heads`)."""
    try:
        graph = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"symbol file {path.name} is not JSON: {reason(exc, 120)}") from None
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list) or not graph["nodes"] \
            or "heads" not in graph:
        found = sorted(graph)[:5] if isinstance(graph, dict) else type(graph).__name__
        raise ModelError(f"symbol file {path.name} is not an MXNet symbol graph: expected 'nodes' "
                         f"and 'heads', found {found}")


def _check_outputs_count(name: str, sym: mx.sym.Symbol, stated: list[tuple[str, str]] | None) -> None:
    """As many outputs as `--outputs` names (one unless it names several): a symbol with several
    heads returns a list, refused here in one line unless each head is named, not at its first
    run ("'list' object has no attribute 'wait_to_read'")."""
    outputs = sym.list_outputs()
    want = 1 if stated is None else len(stated)
    if len(outputs) != want:
        shown = ", ".join(outputs[:5]) + (", ..." if len(outputs) > 5 else "")
        raise ModelError(f"model {name} has {len(outputs)} outputs ({shown}) and --outputs names "
                         f"{want}; allowed: name each output in order, --outputs NAME=KIND,NAME=KIND "
                         "(one output: a kind, or auto)")


def add_exported(settings: Settings, name: str, symbol: Path, params: Path,
                 input_shape: tuple[int, ...] | None, preprocess: Preprocess | None = None,
                 max_batch: int | None = None, outputs: str = "auto") -> ModelRecord:
    """A user's `net.export()` output, checked by shape inference at the largest batch a job
    may ask (`max_batch`, default MXQ_MAX_BATCH_SIZE) and small ones, then by loading it and
    running one sample; `outputs` (`auto`, or one of OUTPUT_KINDS) says what it outputs, or has
    it detected (`detect_outputs`); NAME=KIND,… names each of several outputs (`_heads`)."""
    try:
        stated = parse_heads(outputs)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    for f in (symbol, params):
        if not f.is_file():
            raise ModelError(f"{f} does not exist")
    _check_symbol_file(symbol)
    _check_params_file(params)
    try:
        shape = input_shape or _symbol_shape(symbol, _data_name(symbol, params))
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"cannot read {symbol.name} / {params.name}: {reason(exc)}") from None
    if shape is None:
        raise ModelError(f"{symbol.name} does not record its input shape; pass --input-shape "
                         "(one sample, e.g. 64 or 3,32,32)")
    net = _open(symbol, params, mx.cpu())  # loads, runs nothing
    _check_outputs_count(name, net.mxq_symbol, stated)
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
        _check_output_shape(out.shape, outputs)
        fields |= {"classes": int(out.shape[1]), "outputs": detect_outputs(net, symbol, shape, outputs)}
    else:
        heads = _heads(net, shape, stated)
        fields |= {"classes": sum(h["width"] for h in heads), "outputs": HEADS, "heads": heads}

    def write(folder: Path) -> None:
        shutil.copyfile(symbol, folder / f"{PREFIX}-symbol.json")
        shutil.copyfile(params, folder / f"{PREFIX}-0000.params")

    return _register(settings, name, write, fields, preprocess)


def _heads(net: gluon.Block, shape: tuple[int, ...], stated: list[tuple[str, str]]) -> list[Head]:
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
                    "probabilities" if out.ndim == 2 and _look_like_probabilities(out) else "logits")
        try:
            _check_output_shape((1, *out.shape[1:]), kind)
            if kind not in CLASSIFIER_OUTPUTS:
                kind = value_kind(kind, out)
            elif kind == "probabilities" and not _look_like_probabilities(out):
                raise ModelError(f"its rows do not sum to 1 (row sums {_sums(out)})")
        except ModelError as exc:
            raise ModelError(f"--outputs {name}={kind}: output {name}: {exc}") from None
        heads.append({"name": name, "kind": kind, "width": int(out.shape[1])})
    return heads


def _check_output_shape(shape: tuple[int, ...], outputs: str) -> None:
    """One row per sample: (1, classes) for a classifier (at least 2), (1, width) otherwise."""
    least = 2 if outputs in CLASSIFIER_OUTPUTS else 1
    if len(shape) != 2 or shape[0] != 1 or shape[1] < least:
        want = "(batch, classes), 2 classes or more" if least == 2 else "(batch, values)"
        raise ModelError(f"model output has shape {shape} for one sample; mxq expects {want}"
                         + ("" if least == 1 else ", or --outputs regression for one value"))


def load(settings: Settings, model: ModelRecord, ctx: mx.Context) -> tuple[gluon.SymbolBlock, bool]:
    """The loaded, hybridized model and whether it came from this process's cache."""
    key = (model["name"], model["version"], model["checksum"], str(ctx))
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key], True
    net = _open(*_checked_files(settings, model), ctx)
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
    net = _open(*_checked_files(settings, model), ctxs[0])
    net.collect_params().reset_ctx(ctxs)
    net.cast(dtype)
    return net


def forget_all() -> int:
    """Drop every loaded net (a worker whose device is leased to a training); how many."""
    count = len(_cache)
    _cache.clear()
    return count


def _export(net: gluon.HybridBlock, prefix: Path, input_shape: tuple[int, ...]) -> None:
    """Symbol and weights files; the export traces the net's own compiled graph, which a net
    trained inside a larger graph (tasks.fit.TrainStep) gets only by one forward pass of its own."""
    param = next(iter(net.collect_params().values()))
    net(mx.nd.zeros((1, *input_shape), ctx=param.list_ctx()[0], dtype=param.dtype))
    net.export(str(prefix), 0)


def add_trained(settings: Settings, name: str, net: gluon.HybridBlock, trained: TrainedVersion,
                metrics: dict[str, Any], job_id: int, fence: Fence | None = None) -> ModelRecord:
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
