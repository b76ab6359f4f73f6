"""Out of memory: tell MXNet's allocation failures apart from other errors.

MXNet 1.9.1 reports them as `MXNetError`, raised where the result is read (`asnumpy`, `wait_to_read`)
because the engine is asynchronous:

- CPU (host memory, e.g. under the worker's `MXQ_WORKER_MEMORY_MB` cap):
  "src/storage/./cpu_device_storage.h ... Failed to allocate CPU Memory";
- GPU: "cudaMalloc failed: out of memory" / "cudaMalloc retry failed: out of memory", or a CUDA or
  cuDNN call that could not get memory ("CUDA: out of memory", "CUDNN_STATUS_ALLOC_FAILED").

NumPy's `MemoryError` (copying a batch into MXNet) and a C++ `std::bad_alloc` passed through by
MXNet are out of memory too. ONNX Runtime raises its own: "Failed to allocate memory for requested
buffer of size N" from its arenas, "CUDA failure 2: out of memory" on a GPU.
"""

from __future__ import annotations

from mxq.tasks.job_context import JobInputError

NEEDLES = (
    "out of memory",  # GPU: cudaMalloc, CUDA calls
    "failed to allocate cpu memory",  # CPU: MXNet's host storage
    "cudaerrormemoryallocation",
    "cudnn_status_alloc_failed",
    "std::bad_alloc",
    "failed to allocate memory for requested buffer",  # ONNX Runtime's arenas (CPU and GPU)
)


class OutOfMemory(JobInputError):
    """A batch did not fit even at the smallest batch size; the message says where."""


def is_out_of_memory(exc: BaseException) -> bool:
    """True when `exc` says the device (or the host) could not allocate memory."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return any(needle in text for needle in NEEDLES)
