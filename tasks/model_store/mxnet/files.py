"""A version's MXNet files (`model-symbol.json` + `model-0000.params`, MXNet's export format): each
checked from its own bytes before MXNet reads it, the input they take, and the net they load as.
"""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import numpy as np

from mxq.errors import reason
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.runtimes.mx import DeviceFault, device_fault, gluon, mx

PREFIX = "model"  # the files' prefix: model-symbol.json, model-0000.params
PARAMS_MAGIC = 0x112  # MXNet's NDArray-list files start with it (then 8 reserved bytes, a count)


def check_params_file(path: Path) -> None:
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


def check_symbol_file(path: Path) -> None:
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


def symbol_shape(symbol_file: Path, data: str) -> tuple[int, ...] | None:
    """The input shape recorded in the symbol (`__shape__` of the data node), when there is one."""
    for node in json.loads(symbol_file.read_text()).get("nodes", []):
        shape = node.get("attrs", {}).get("__shape__")
        if node.get("op") == "null" and node.get("name") == data and shape:
            dims = tuple(int(d) for d in shape.strip("()[] ").split(",") if d.strip())
            return dims[1:] if len(dims) > 1 else None
    return None


def data_name(symbol_file: Path, params_file: Path) -> str:
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


def check_outputs_count(name: str, sym: mx.sym.Symbol, stated: list[tuple[str, str]] | None) -> None:
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


def weights_dtype(net: gluon.Block) -> str:
    return np.dtype(next(iter(net.collect_params().values())).dtype).name


def input_dtype(net: gluon.Block) -> str:
    """The dtype a batch must have for `net`: that of its weights (float16 or float32), noted on
    a stored net when it is opened (so not looked up on every batch)."""
    return getattr(net, "mxq_input_dtype", None) or weights_dtype(net)


def open_net(symbol_file: Path, params_file: Path, ctx: mx.Context) -> gluon.SymbolBlock:
    """The stored net on `ctx`. Weights saved in float16 (a net trained with `--dtype float16`)
    stay so on a GPU, which is then fed float16 batches; on a CPU the net is cast to float32,
    since MXNet's CPU kernels (FullyConnected, Convolution) have no float16."""
    try:
        data = data_name(symbol_file, params_file)
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
    dtype = weights_dtype(net)
    if ctx.device_type == "cpu" and dtype != "float32":
        net.cast("float32")
        dtype = "float32"
    net.mxq_input_dtype = dtype
    net.mxq_symbol, net.mxq_data = mx.sym.load(str(symbol_file)), data  # for check_batch
    return net
