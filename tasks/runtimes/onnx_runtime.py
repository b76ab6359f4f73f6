"""ONNX Runtime sessions for a worker: pinned to its cores, one per model file, kept loaded.

On a CPU device the worker owns a slice of the host's cores (`mxq.workers.hardware.pinning`, which sets
OMP_NUM_THREADS to the slice's size for MXNet); ONNX Runtime's intra-op pool gets as many
threads, and no inter-op pool, so two workers never compete for one core.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from mxq.errors import DeviceFault, first_line

if TYPE_CHECKING:  # imported where a session is made: a worker that serves MXNet only never loads it
    from onnxruntime import InferenceSession

CACHE_SIZE = 2  # sessions kept per worker process, as for MXNet models (tasks.models)
_sessions: OrderedDict[tuple[str, int, str], InferenceSession] = OrderedDict()


# The execution provider that runs a kind of device.
PROVIDERS = {"cpu": "CPUExecutionProvider", "gpu": "CUDAExecutionProvider"}


def unavailable(kind: str = "cpu") -> str | None:
    """None when ONNX Runtime can run on `kind` devices here, else why not."""
    try:
        import onnxruntime as ort
    except ImportError:
        return ("ONNX Runtime is not installed (the cpu and gpu extras have it for CPUs; for GPUs, "
                "the gpu-onnx extra in an environment of its own: docs/gpu-hosts.md)")
    if PROVIDERS[kind] not in ort.get_available_providers():
        return f"this ONNX Runtime has no {PROVIDERS[kind]} for {kind} devices"
    return None


def threads() -> int:
    """The worker's cores: OMP_NUM_THREADS as pinning set it, else the CPUs it may run on."""
    pinned = os.environ.get("OMP_NUM_THREADS", "")
    return int(pinned) if pinned.isdigit() and int(pinned) > 0 else len(os.sched_getaffinity(0))


def session(path: Path, kind: str = "cpu") -> tuple[InferenceSession, bool]:
    """The loaded session for the ONNX file `path` on `kind` devices (reloaded when the file
    changes), and whether it came from this process's cache; a GPU worker sees only its own GPU
    (CUDA_VISIBLE_DEVICES), device 0 to it."""
    import onnxruntime as ort

    if kind == "gpu":
        _load_cuda_wheels(ort)
    key = (str(path), path.stat().st_mtime_ns, kind)
    if key in _sessions:
        _sessions.move_to_end(key)
        return _sessions[key], True
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: its warnings are about graph rewrites
    # Idle pool threads sleep instead of spinning: the job's reader and writer threads share the cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    made = ort.InferenceSession(str(path), options, providers=[PROVIDERS[kind]])
    check_providers(made, kind)
    _sessions[key] = made
    while len(_sessions) > CACHE_SIZE:
        _sessions.popitem(last=False)
    return _sessions[key], False


class ProviderFallback(DeviceFault):
    """ONNX Runtime gave a session without the provider of the device it was asked for: the
    device's fault (CUDA cannot start there), never the model's."""


def check_providers(sess: InferenceSession, kind: str) -> None:
    """Refuse a session whose first provider is not `kind`'s: asked for the CUDA provider and
    unable to start CUDA, ONNX Runtime falls back to the CPU with a warning, and a job recorded
    on a GPU computed on the CPU in silence."""
    given = list(sess.get_providers())
    if not given or given[0] != PROVIDERS[kind]:
        raise ProviderFallback(f"ONNX Runtime gave a session with providers {given} for a {kind} "
                               f"device, not {PROVIDERS[kind]} first: CUDA cannot start on this "
                               "device, and it would compute on the CPU; the job stops instead")


def forget(path: Path, kind: str = "cpu") -> None:
    """Drop the cached session of `path` on `kind` devices: the job that holds it keeps using
    it, and the next job loads a new one. After running out of memory a session's CPU arena
    keeps every chunk it got, up to the failed batch's, for the session's life: a capped worker
    that halved a batch on ONNX Runtime held on to that memory, and its next job could not read
    1 MiB."""
    for key in [k for k in _sessions if k[0] == str(path) and k[2] == kind]:
        del _sessions[key]


def forget_all() -> int:
    """Drop every cached session (a worker whose device is leased to a training); how many."""
    count = len(_sessions)
    _sessions.clear()
    return count


def run(sess: InferenceSession, x: NDArray[np.float32]) -> NDArray[np.float32]:
    """Class probabilities of one batch (the exported graph ends in a softmax), as float32."""
    return runner(sess)(x)


def runner(sess: InferenceSession) -> Callable[[NDArray[np.float32]], NDArray[np.float32]]:
    """`run` for one session, its input name looked up once (a job calls it for every batch)."""
    name = sess.get_inputs()[0].name

    def forward(x: NDArray[np.float32]) -> NDArray[np.float32]:
        out = sess.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})[0]
        return np.asarray(out, dtype=np.float32)

    return forward


@cache
def _load_cuda_wheels(ort: ModuleType) -> None:
    """CUDA 12 and cuDNN 9 from the gpu-onnx extra's nvidia-*-cu12 wheels, loaded by ONNX
    Runtime itself from site-packages (no LD_LIBRARY_PATH), once per process."""
    ort.preload_dlls(cuda=True, cudnn=True, msvc=False)


def cuda_problem(device: str) -> str | None:
    """Whether ONNX Runtime's CUDA provider really runs on this worker's GPU: it falls back to
    the CPU when CUDA cannot start (no GPU, no driver), so a real check graph is run through it,
    a matrix multiply (cuBLAS) and a convolution (cuDNN), and its results are compared with
    NumPy's: a GPU that loads the libraries but computes wrong is refused too."""
    import onnxruntime as ort

    model, feeds, expected = check_graph()
    said = io.StringIO()  # ONNX Runtime prints why CUDA failed, then falls back to the CPU
    try:
        _load_cuda_wheels(ort)
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            sess = ort.InferenceSession(model, providers=[PROVIDERS["gpu"]])
        got = sess.run(None, feeds)
    except Exception as exc:
        return f"ONNX Runtime's CUDA provider cannot start on {device}: {first_line(exc)}"
    if PROVIDERS["gpu"] not in sess.get_providers():
        found = re.search(r"CUDA failure \d+: [^;]*?(?= ;|$)", said.getvalue(), re.MULTILINE)
        cause = f" ({found.group(0).strip()})" if found else ""
        return (f"ONNX Runtime's CUDA provider cannot start on {device}{cause}: no GPU visible, or "
                "the driver is missing or older than R525, which CUDA 12 needs; it would run on the CPU")
    return wrong_results(device, got, expected)


# The start check's work: a 64x64 matrix multiply and a 3x3 convolution of a 3x16x16 image into
# 8 channels, on fixed inputs, with NumPy's answers.
CHECK_SIDE, CHECK_IMAGE, CHECK_FILTERS = 64, (1, 3, 16, 16), 8


def check_graph() -> tuple[bytes, dict[str, NDArray[np.float32]], list[NDArray[np.float64]]]:
    """The check graph (MatMul and Conv), its inputs and what they must give."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    a = rng.standard_normal((CHECK_SIDE, CHECK_SIDE)).astype(np.float32)
    b = rng.standard_normal((CHECK_SIDE, CHECK_SIDE)).astype(np.float32)
    image = rng.standard_normal(CHECK_IMAGE).astype(np.float32)
    weights = rng.standard_normal((CHECK_FILTERS, CHECK_IMAGE[1], 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["product"]),
         helper.make_node("Conv", ["image", "weights"], ["features"], pads=[1, 1, 1, 1])],
        "start-check",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape)),
         helper.make_tensor_value_info("image", TensorProto.FLOAT, list(image.shape))],
        [helper.make_tensor_value_info("product", TensorProto.FLOAT, [CHECK_SIDE, CHECK_SIDE]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT,
                                       [1, CHECK_FILTERS, *CHECK_IMAGE[2:]])],
        initializer=[numpy_helper.from_array(b, "b"), numpy_helper.from_array(weights, "weights")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    padded = np.pad(image.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    height, width = CHECK_IMAGE[2:]
    features = sum(np.einsum("nchw,fc->nfhw", padded[:, :, i:i + height, j:j + width],
                             weights[:, :, i, j].astype(np.float64))
                   for i in range(3) for j in range(3))  # the 3x3 convolution, one tap at a time
    return model.SerializeToString(), {"a": a, "image": image}, \
        [a.astype(np.float64) @ b.astype(np.float64), features]


def wrong_results(device: str, got: list[NDArray[np.generic]],
                  expected: list[NDArray[np.float64]]) -> str | None:
    """Why the check graph's results `got` on `device` are not NumPy's (`expected`), or None:
    float32 rounding allowed, a wrong value or a NaN not."""
    for name, raw, want in zip(("matrix multiply", "convolution"), got, expected, strict=True):
        out = np.asarray(raw, dtype=np.float64)
        if out.shape != want.shape or not np.allclose(out, want, rtol=1e-3, atol=1e-3):
            off = float(np.max(np.abs(out - want))) if out.shape == want.shape else float("nan")
            return (f"{device} computed the start check's {name} wrong through ONNX Runtime's CUDA "
                    f"provider (off by up to {off:.3g}; shape {out.shape}): the GPU or its driver "
                    "is faulty")
    return None
