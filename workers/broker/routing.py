"""Routing: turn the device a job asks for into the queue its message goes to.

A job that needs one engine (training and probes need MXNet; an inference may need the one it
asked for) goes only where that engine runs: to its kind's engine pool (`pool.gpu.mxnet`) when
`auto`, and a named device without it is refused, naming the devices that have it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mxq.db.fleet import kinds, list_workers, out_note
from mxq.db.records import WorkerRecord
from mxq.device import KINDS, Device
from mxq.errors import UserError
from mxq.workers.broker.queues import DeviceSpec, device_queue, pool_queue
from mxq.workers.settings import Settings

ENGINE_NAMES = {"mxnet": "MXNet", "onnx": "ONNX Runtime"}


class RoutingError(UserError):
    """The job cannot be routed as asked; the message says why and what would work."""


@dataclass(frozen=True)
class Route:
    queue: str
    requested: str


@dataclass(frozen=True)
class Need:
    """The engine a job cannot run without, and the job in words for a refusal."""

    engine: str | None = None
    what: str = "this job"


def _workers(settings: Settings) -> dict[str, WorkerRecord]:
    return {w["device"]: w for w in list_workers(settings.database, settings.heartbeat_ttl, settings.node)}


def _unknown(settings: Settings, spec: DeviceSpec, mine: dict[str, WorkerRecord]) -> RoutingError:
    have = ", ".join(sorted(mine)) or "none (no worker has started on it yet)"
    return RoutingError(f"device {spec} is not known on node {settings.node}; known devices: {have}")


def check_known(settings: Settings, spec: DeviceSpec) -> None:
    """A named device must be one a worker of this node has served, as `route` checks it for
    `mxq infer`, though it need not be up now (a schedule fires later); `auto` always is."""
    if not spec.auto and str(spec) not in (mine := _workers(settings)):
        raise _unknown(settings, spec, mine)


def route(settings: Settings, spec: DeviceSpec, allow_offline: bool = False,
          need: Need = Need()) -> Route:
    """A named device goes to its own queue on this node; `auto` to its kind's pool queue (the
    engine's pool when the job needs one)."""
    if spec.auto:
        return Route(_pool_for(settings, spec, allow_offline, need), str(spec))
    mine = _workers(settings)
    worker = mine.get(str(spec))
    if worker is None and not allow_offline:
        raise _unknown(settings, spec, mine)
    if worker is not None:
        _check_serves(settings, spec, worker, allow_offline, need, mine)
    assert spec.kind is not None and spec.index is not None  # not auto
    return Route(device_queue(settings.node, spec.kind, spec.index), str(spec))


def _check_serves(settings: Settings, spec: DeviceSpec, worker: WorkerRecord, allow_offline: bool,
                  need: Need, mine: dict[str, WorkerRecord]) -> None:
    """The named device's worker can take the job now (unless `allow_offline`: it may wait for
    its check or its start), with the engine the job needs."""
    if worker["health"] == "out" and not allow_offline:
        raise RoutingError(f"device {spec} on node {settings.node} is "
                           f"{out_note(worker['out_reason'], worker['out_since'])}; pass "
                           "--allow-offline to queue the job until it passes its check again "
                           f"(probed every MXQ_REPROBE_SECONDS, doubling), or --device auto:{spec.kind}")
    if not worker["alive"] and not allow_offline:
        raise RoutingError(f"device {spec} on node {settings.node} has no live worker; "
                           "start workers with `mxq up` (or `mxq worker`), or pass "
                           "--allow-offline to queue the job until one starts")
    if need.engine and need.engine not in worker["engines"]:
        raise RoutingError(_cannot_run(settings, worker, need, list(mine.values())))


def describe(worker: WorkerRecord) -> str:
    """`gpu:2 (NVIDIA H200, compute capability 9.0)`: the device as a refusal names it."""
    info = worker["info"] or {}
    said = ", ".join(x for x in (info.get("name"), info.get("compute_cap") and
                                 f"compute capability {info['compute_cap']}") if x)
    return f"{worker['device']} ({said})" if said else worker["device"]


def _cannot_run(settings: Settings, worker: WorkerRecord, need: Need,
                workers: list[WorkerRecord]) -> str:
    assert need.engine is not None
    kind = Device.parse(worker["device"]).kind
    able = sorted(w["device"] for w in workers
                  if need.engine in w["engines"] and Device.parse(w["device"]).kind == kind)
    runs = " and ".join(ENGINE_NAMES[e] for e in worker["engines"]) or "no engine"
    return (f"device {describe(worker)} on node {settings.node} runs {runs} only, and "
            f"{need.what} needs {ENGINE_NAMES[need.engine]}; devices that can: "
            f"{', '.join(able) or 'none on this node'} (or --device auto:{kind})")


def _pool_for(settings: Settings, spec: DeviceSpec, allow_offline: bool, need: Need) -> str:
    wanted = (spec.kind,) if spec.kind else KINDS  # GPUs first when both are live
    live, known = kinds(settings.database, settings.heartbeat_ttl, wanted, need.engine)
    for kind in wanted:
        if kind in live:
            return pool_queue(kind, need.engine)
    if allow_offline:
        return pool_queue(next((k for k in wanted if k in known), wanted[-1]), need.engine)
    kind = f"{spec.kind} " if spec.kind else ""
    engine = f" that runs {ENGINE_NAMES[need.engine]} ({need.what} needs it)" if need.engine else ""
    raise RoutingError(f"no live {kind}worker{engine} to run an auto job; start workers with "
                       "`mxq up` (or `mxq worker`), or pass --allow-offline to queue it anyway")
