"""ONNX Runtime sessions for a worker: pinned to its cores, one per model file, kept loaded.

On a CPU device the worker owns a slice of the host's cores (`mxq.workers.hardware.pinning`, which sets
OMP_NUM_THREADS to the slice's size for MXNet); ONNX Runtime's intra-op pool gets as many
threads, and no inter-op pool, so two workers never compete for one core.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from mxq.errors import DeviceFault

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
        load_cuda_wheels(ort)
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
def load_cuda_wheels(ort: ModuleType) -> None:
    """CUDA 12 and cuDNN 9 from the gpu-onnx extra's nvidia-*-cu12 wheels, loaded by ONNX
    Runtime itself from site-packages (no LD_LIBRARY_PATH), once per process."""
    ort.preload_dlls(cuda=True, cudnn=True, msvc=False)
