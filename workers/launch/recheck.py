"""GPUs the launcher planned no worker for, recorded and planned again on its probe cadence.

A GPU refused at planning (memory another process holds, MIG, the Prohibited compute mode, an
MXNet build or a driver that cannot run it, broken NVIDIA wheels) or missing from nvidia-smi's
listing (fewer GPUs listed than MXQ_EXPECTED_GPUS) has no worker to beat or refuse. Its row says
so (`out`, with why: mxq.db.fleet.hold_out), which `mxq devices`, the dashboard and `/metrics`
show, and `device.out` is told once per outage (a launcher restarted by Compose finds the row
out already and tells nothing). Every MXQ_REPROBE_SECONDS the launcher asks nvidia-smi again and
plans them again, in a thread of its own (nvidia-smi may hang up to its timeout; the launcher
keeps supervising meanwhile); one that now plans gets its worker, whose registration tells
`device.back`; one still held has its reason updated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from mxq.db import fleet
from mxq.workers.broker.queues import device_queue, worker_name
from mxq.workers.hardware.devices import DiscoveredDevice, cpu_devices, host_gpus, installed_mxnet, visible
from mxq.workers.hardware.unplanned import Unplanned, missing_gpus, reasons, remembered
from mxq.workers.launch.launcher import WorkerSpec, plan_devices
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)


class NodePlan(NamedTuple):
    """What the launcher starts (`specs`), and the GPUs it plans no worker for (`unplanned`)."""

    specs: list[WorkerSpec]
    unplanned: list[Unplanned]

    @property
    def refused(self) -> list[str]:
        """Why each is held, each reason once."""
        return reasons(self.unplanned)


def node_plan(settings: Settings) -> NodePlan:
    """This node's plan: nvidia-smi's GPUs (those CUDA_VISIBLE_DEVICES lets it use) or CPU
    devices, each usable one's worker, and those refused or missing (MXQ_EXPECTED_GPUS)."""
    gpus = host_gpus(settings.nvidia_smi, settings.host_gpu_ids,
                     settings.expect_gpus or settings.expected_gpus is not None)
    devices = visible(gpus, settings.cuda_visible_devices) or cpu_devices(settings.cpu_devices)
    specs, refused = plan_devices(settings, devices, settings.mxnet_build or installed_mxnet())
    return NodePlan(specs, refused + missing_gpus(gpus, settings.expected_gpus))


class Recheck:
    """The launcher's held GPUs: `record` them at its start, then call it at each poll for the
    workers of those that became usable."""

    def __init__(self, settings: Settings, node: NodePlan,
                 replan: Callable[[], NodePlan] | None = None) -> None:
        self.settings, self.held = settings, node.unplanned
        self.planned = {s.name for s in node.specs}
        self.listed = _uuids(node)  # a missing GPU is named by a remembered UUID not among these
        self.replan = replan or (lambda: node_plan(settings))
        self.due = time.monotonic() + settings.reprobe_seconds
        self.pending: Future[NodePlan] | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mxq-recheck")

    def record(self, first: bool = True) -> None:
        """Write each held GPU's row: `out` with why (`device.out` only where it was not out);
        said in the log at the launcher's start, not at each check again."""
        known = fleet.node_gpus(self.settings.database, self.settings.node)
        for held in self.held:
            held = remembered(held, known.get(held.device.label, {}), self.listed)
            name, queue = _name(self.settings, held.device)
            fleet.hold_out(self.settings.database, name, self.settings.node, held.device.label,
                           queue, held.device.info(), held.cause, held.reason)
            if first:
                log.error("%s has no worker: %s; checking it again every %.0fs", held.device.label,
                          held.reason, self.settings.reprobe_seconds)

    def __call__(self) -> list[WorkerSpec]:
        """The workers to start now: those of held GPUs the last replan found usable."""
        if not self.held:
            return []
        now = time.monotonic()
        if self.pending is None and now >= self.due:
            self.pending = self.pool.submit(self.replan)
        if self.pending is None or not self.pending.done():
            return []
        done, self.pending = self.pending, None
        self.due = now + self.settings.reprobe_seconds
        try:
            return self._adopt(done.result())
        except Exception:  # nvidia-smi failed, the database is down: the supervisor outlives it
            log.exception("could not check the GPUs with no worker again; trying again in %.0fs",
                          self.settings.reprobe_seconds)
            return []

    def _adopt(self, node: NodePlan) -> list[WorkerSpec]:
        """Start the held GPUs that plan now; record those still held (a reason may change)."""
        held = {_name(self.settings, u.device)[0] for u in self.held}
        started = [s for s in node.specs if s.name in held and s.name not in self.planned]
        for spec in started:
            assert spec.device is not None
            fleet.describe(self.settings.database, spec.name, spec.device.info())
            log.warning("%s plans now (%s); starting its worker", spec.device.label, spec.name)
        self.planned |= {s.name for s in started}
        self.held = [u for u in node.unplanned if _name(self.settings, u.device)[0] not in self.planned]
        self.listed = _uuids(node)
        self.record(first=False)
        return started

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _uuids(node: NodePlan) -> set[str]:
    """The UUIDs nvidia-smi listed for a plan: its workers' GPUs' and the refused ones'."""
    devices = [s.device for s in node.specs if s.device is not None] + [u.device for u in node.unplanned
                                                                       if u.cause != "missing"]
    return {d.uuid for d in devices if d.uuid}


def _name(settings: Settings, device: DiscoveredDevice) -> tuple[str, str]:
    """The worker name and device queue a held GPU's row has: its worker's, had it one."""
    return (worker_name(settings.node, device.kind, device.index),
            device_queue(settings.node, device.kind, device.index))
