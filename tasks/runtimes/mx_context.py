"""The MXNet side of pinning: the MXNet context of this worker's device and its memory figures.

Imported by a device worker at start (`DEVICE_TASK_MODULES`), when it refuses a device MXNet
cannot see. The device comes parsed (`mxq.device.Device`: the job frame's `JobContext.parsed_device`).
"""

from __future__ import annotations

import os

from celery import signals

from mxq.device import Device
from mxq.errors import reason
from mxq.tasks.runtimes.mx import mx
from mxq.workers.hardware.start_check import check_or_refuse
from mxq.workers.settings import get_settings


def context(device: Device) -> mx.Context:
    """A GPU worker sees only its own GPU (CUDA_VISIBLE_DEVICES), as gpu(0)."""
    if device.is_gpu:
        return mx.gpu(0)
    return mx.cpu(device.index)


def memory(device: Device) -> dict[str, float]:
    """Free and total memory of the device, in MiB (host memory for a CPU device)."""
    if device.is_gpu:
        free, total = mx.context.gpu_memory_info(0)
        return {"memory_total_mib": total / 2**20, "memory_free_mib": free / 2**20}
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"memory_total_mib": pages / 2**20, "memory_free_mib": avail / 2**20}


def check_visible(device: Device) -> str | None:
    """Before a GPU worker takes work: MXNet sees exactly one GPU, and a real operation runs on
    it (allocate, a small matmul, copy back). Any error refuses this device alone, named with the
    error: a GPU that only counted as present once passed, then failed every job it took."""
    if not device.is_gpu:
        return None
    try:
        seen = mx.context.num_gpus()
        if seen != 1:
            return (f"worker for {device} sees {seen} GPUs through MXNet (expected 1): check "
                    "CUDA_VISIBLE_DEVICES and that the GPU build of MXNet (mxnet-cu112) is installed")
        a = mx.nd.ones((8, 8), ctx=mx.gpu(0))
        if float(mx.nd.dot(a, a).sum().asscalar()) != 512.0:
            return f"worker for {device}: a matmul on the GPU gave a wrong result"
    except Exception as exc:  # MXNetError, a CUDA error: the device's, whatever its type
        return f"worker for {device}: the GPU failed its start check ({reason(exc)})"
    return None


@signals.worker_init.connect  # type: ignore[untyped-decorator]  # Celery has no types
def _refuse_unusable_device(**_: object) -> None:
    """Exit before consuming anything when MXNet cannot use the pinned device, or its check does
    not finish within MXQ_START_CHECK_SECONDS (a hung GPU)."""
    s = get_settings()
    device = s.device
    if device:
        check_or_refuse(s.start_check_seconds, lambda: check_visible(Device.parse(device)), device)
