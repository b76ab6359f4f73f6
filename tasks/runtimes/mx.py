"""MXNet, importable from any process on a CPU or a GPU install: import it from here.

On a GPU install the CUDA libraries of the wheels are loaded first (`tasks.cuda`); a host whose
NVIDIA driver library is missing gets one clear error instead of a loader message.

MXNet ships no types: to mypy, `mx`, `gluon` and `nd` are Any, so an annotation such as
`gluon.Block` or `mx.Context` says what a value is without being checked; where a function needs
one thing of an MXNet object, a Protocol says which (`probe._Pending`).
"""

from __future__ import annotations

from mxq.errors import DeviceFault, device_fault
from mxq.tasks.runtimes.cuda import load_cuda_libraries

load_cuda_libraries()
try:
    import mxnet as mx
except OSError as exc:
    if "libcuda.so" not in str(exc):
        raise
    raise ImportError(f"the GPU build of MXNet cannot load the NVIDIA driver's library ({exc}): "
                      "install the NVIDIA driver (R520 or newer), or on a host without GPUs the "
                      "CPU build (pip install '.[cpu]')") from exc

autograd, gluon, nd = mx.autograd, mx.gluon, mx.nd

__all__ = ["DeviceFault", "autograd", "device_fault", "gluon", "mx", "nd"]
