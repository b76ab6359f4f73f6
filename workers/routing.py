"""Routing: turn the device a job asks for into the queue its message goes to."""

from __future__ import annotations

from dataclasses import dataclass

from mxq.db.fleet import kinds, list_workers
from mxq.device import KINDS
from mxq.errors import UserError
from mxq.workers.queues import DeviceSpec, device_queue, pool_queue
from mxq.workers.settings import Settings


class RoutingError(UserError):
    """The job cannot be routed as asked; the message says why and what would work."""


@dataclass(frozen=True)
class Route:
    queue: str
    requested: str


def route(settings: Settings, spec: DeviceSpec, allow_offline: bool = False) -> Route:
    """A named device goes to its own queue on this node; `auto` to its kind's pool queue."""
    if spec.auto:
        return Route(_pool_for(settings, spec, allow_offline), str(spec))
    mine = {w["device"]: w for w in list_workers(settings.database, settings.heartbeat_ttl,
                                                 settings.node)}
    worker = mine.get(str(spec))
    if worker is None and not allow_offline:
        have = ", ".join(sorted(mine)) or "none (no worker has started on it yet)"
        raise RoutingError(f"device {spec} is not known on node {settings.node}; "
                           f"known devices: {have}")
    if worker is not None and not worker["alive"] and not allow_offline:
        raise RoutingError(f"device {spec} on node {settings.node} has no live worker; "
                           "start workers with `mxq up` (or `mxq worker`), or pass "
                           "--allow-offline to queue the job until one starts")
    assert spec.kind is not None and spec.index is not None  # not auto
    return Route(device_queue(settings.node, spec.kind, spec.index), str(spec))


def _pool_for(settings: Settings, spec: DeviceSpec, allow_offline: bool) -> str:
    wanted = (spec.kind,) if spec.kind else KINDS  # GPUs first when both are live
    live, known = kinds(settings.database, settings.heartbeat_ttl, wanted)
    for kind in wanted:
        if kind in live:
            return pool_queue(kind)
    if allow_offline:
        return pool_queue(next((k for k in wanted if k in known), wanted[-1]))
    kind = f"{spec.kind} " if spec.kind else ""
    raise RoutingError(f"no live {kind}worker to run an auto job; start workers with "
                       "`mxq up` (or `mxq worker`), or pass --allow-offline to queue it anyway")
