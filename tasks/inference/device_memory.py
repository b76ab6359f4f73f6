"""What an idle device worker gives back while its device is leased to another job's training.

A data-parallel training leases K devices and runs its child process on all of them; the
workers of the other K-1 devices stay up, idle, deferring jobs. Each kept the models and ONNX
Runtime sessions it had cached and, on a GPU, MXNet's memory pool: gigabytes of the GPU the
training needed. At each idle beat (`workers.fleet.heartbeat.on_idle`) the worker looks at its
device's lease, and once per lease drops its caches and empties MXNet's pool on the device; the
next job after the training loads its model again. A worker in the middle of a delivery holds
`runner.DELIVERY`, and nothing is freed under it.
"""

from __future__ import annotations

import gc
import logging
import sys

from mxq.device import Device
from mxq.tasks.runner import DELIVERY
from mxq.tasks.runtimes import onnx_runtime
from mxq.workers.fleet import heartbeat, leases
from mxq.workers.settings import get_settings

log = logging.getLogger(__name__)

_given_to: list[int | None] = [None]  # the lease (its job) this worker last gave its memory to


def give_back(device: Device) -> int:
    """Drop every cached model and session and empty MXNet's pool on `device`; how many cached
    models and sessions went. MXNet is touched only when this process loaded it (an ONNX-only
    worker has none)."""
    dropped = onnx_runtime.forget_all()
    models = sys.modules.get("mxq.tasks.model_store.models")
    if models is not None:
        dropped += models.forget_all()
    gc.collect()  # the nets' arrays return to MXNet's pool only when nothing refers to them
    if models is not None and device.is_gpu:
        from mxq.tasks.runtimes.mx_context import context
        context(device).empty_cache()
    return dropped


def give_back_while_leased() -> None:
    """At an idle beat: give back the device's memory once per lease another job holds on it."""
    s = get_settings()
    if s.device is None:
        return
    holder = leases.holders(s.broker, s.node, [s.device]).get(s.device)
    if holder is None or holder == _given_to[0]:
        _given_to[0] = holder
        return
    if not DELIVERY.acquire(blocking=False):  # a job runs: the next idle beat looks again
        return
    try:
        dropped = give_back(Device.parse(s.device))
        _given_to[0] = holder
        log.info("%s is leased by job %s: gave back its memory (%d cached models and sessions "
                 "dropped)", s.device, holder, dropped)
    finally:
        DELIVERY.release()


heartbeat.on_idle.append(give_back_while_leased)
