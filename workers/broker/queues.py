"""Queue and worker naming, and parsing of the device a user asks for."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxq.device import KINDS, Device
from mxq.engines import RUNTIMES
from mxq.errors import UserError

CONTROL_QUEUE = "mxq.control"  # consumed only by the schedule process, never by device workers
# The kombu priorities of mxq's messages (`publish.Turn`): a started and a new step per level,
# high first. Kombu's Redis transport keeps a queue's messages of step p > 0 in the list
# `<queue>\x06\x16<p>` and pops the lowest step first over every queue a worker consumes; every
# app of mxq, publisher or consumer, is configured with these (`app.celery_config`).
PRIORITY_STEPS = (0, 1, 2, 3, 4, 5)
_AUTO = re.compile(r"^auto(?::(gpu|cpu))?$")


class DeviceSpecError(UserError):
    """A device string that is not one of the accepted forms."""


@dataclass(frozen=True)
class DeviceSpec:
    """What a job asks for: one named device, or `auto` (optionally limited to one kind)."""

    kind: str | None  # None: auto, any kind
    index: int | None  # None: auto

    @property
    def auto(self) -> bool:
        return self.index is None

    def __str__(self) -> str:
        if self.auto:
            return f"auto:{self.kind}" if self.kind else "auto"
        return f"{self.kind}:{self.index}"


def parse_device(text: str) -> DeviceSpec:
    value = text.strip().lower()
    if m := _AUTO.match(value):
        return DeviceSpec(kind=m.group(1), index=None)
    try:
        device = Device.parse(value)
    except ValueError:
        device = None
    if device is not None and device.node is None:
        return DeviceSpec(kind=device.kind, index=device.index)
    raise DeviceSpecError(
        f"invalid device {text!r}: expected auto, auto:gpu, auto:cpu, gpu:N or cpu:N "
        "(N a device index such as 0)"
    )


def device_queue(node: str, kind: str, index: int) -> str:
    """The queue only the worker pinned to this device consumes: `<node>.<kind>.<index>`."""
    return f"{node}.{kind}.{index}"


def pool_queue(kind: str, engine: str | None = None) -> str:
    """The shared queue of `kind`: `pool.<kind>` for jobs either engine serves, which every live
    worker of that kind on every node consumes; `pool.<kind>.<engine>` for jobs that need that
    engine, consumed only by the workers that have it (an H200's worker, ONNX Runtime only, never
    takes a training)."""
    return f"pool.{kind}.{engine}" if engine else f"pool.{kind}"


def pool_of(queue: str) -> tuple[str, str | None] | None:
    """The kind and engine of a pool queue (`pool.cpu`, `pool.gpu.mxnet`); None for another queue."""
    parts = queue.split(".")
    if parts[0] != "pool" or len(parts) not in (2, 3):
        return None
    return parts[1], parts[2] if len(parts) == 3 else None


def pool_queues(kind: str, engines: tuple[str, ...] = RUNTIMES) -> list[str]:
    """The pools a worker of `kind` with `engines` consumes."""
    return [pool_queue(kind), *(pool_queue(kind, e) for e in engines)]


def all_pools() -> list[str]:
    """Every pool queue mxq routes to."""
    return [q for kind in KINDS for q in pool_queues(kind)]


def worker_name(node: str, kind: str, index: int) -> str:
    """Celery hostname of a device worker: `<kind><index>@<node>`."""
    return f"{kind}{index}@{node}"
