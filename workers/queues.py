"""Queue and worker naming, and parsing of the device a user asks for."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxq.device import Device
from mxq.errors import UserError

CONTROL_QUEUE = "mxq.control"  # consumed only by the schedule process, never by device workers
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


def pool_queue(kind: str) -> str:
    """The shared queue every live worker of `kind`, on every node, also consumes."""
    return f"pool.{kind}"


def worker_name(node: str, kind: str, index: int) -> str:
    """Celery hostname of a device worker: `<kind><index>@<node>`."""
    return f"{kind}{index}@{node}"
