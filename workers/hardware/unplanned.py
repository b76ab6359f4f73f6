"""GPUs the launcher plans no worker for: refused at planning, or missing from nvidia-smi.

Such a GPU has no worker to beat or refuse, so without a record of its own it had no row in
`mxq devices`, no metric, no webhook and no second look. Each is an `Unplanned`: the device as
nvidia-smi listed it (or as far as it is known: a missing GPU's index, its UUID where this node
saw it before), why (`cause`, a short word a metric can carry), and the one-line reason a person
reads. The launcher records them as `out` and plans them again on its probe cadence
(mxq.workers.launch.recheck).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Literal, NamedTuple

from mxq.workers.hardware.devices import DiscoveredDevice

# Why a GPU has no worker: memory another process holds, the Prohibited compute mode, MIG, an
# MXNet build with no kernels for it (and no ONNX Runtime to serve it instead), a driver too old
# for what would serve it, broken NVIDIA wheels, or absent from nvidia-smi's listing.
Cause = Literal["memory_in_use", "compute_mode", "mig", "mxnet_build", "driver", "wheels", "missing"]

# Causes that may clear while mxq runs (the other process ends, the GPU is listed again, an
# operator sets the compute mode or disables MIG): a node with no worker but such a GPU keeps its
# launcher, checking. The others (the MXNet build, the driver, the wheels) clear with a new install
# and so a new launcher: a node with nothing else to run stops at once, saying why.
HEALS: frozenset[Cause] = frozenset({"memory_in_use", "compute_mode", "mig", "missing"})


class Unplanned(NamedTuple):
    """A GPU with no worker, why (`cause`), and the reason as `mxq devices` says it."""

    device: DiscoveredDevice
    cause: Cause
    reason: str


def reasons(unplanned: list[Unplanned]) -> list[str]:
    """Why GPUs are held, each reason once (broken wheels hold every GPU for one reason)."""
    return list(dict.fromkeys(u.reason for u in unplanned))


def missing_gpus(listed: list[DiscoveredDevice], expected: int | None) -> list[Unplanned]:
    """The GPUs nvidia-smi should list (`expected`, MXQ_EXPECTED_GPUS) and does not: as many as
    it lists too few, each named by the lowest index it does not list (nvidia-smi counts in PCI
    bus order from 0, so with 4 expected and gpu:0, gpu:1, gpu:3 listed, gpu:2 is missing)."""
    if expected is None or len(listed) >= expected:
        return []
    taken = {g.index for g in listed}
    free = (i for i in range(expected + len(listed)) if i not in taken)
    return [Unplanned(DiscoveredDevice("gpu", index), "missing",
                      missing_reason(index, len(listed), expected))
            for index, _ in zip(free, range(expected - len(listed)), strict=False)]


def missing_reason(index: int, listed: int, expected: int) -> str:
    """`gpu:3 is missing: nvidia-smi lists 3 GPUs, 4 expected (MXQ_EXPECTED_GPUS); …`."""
    return (f"gpu:{index} is missing: nvidia-smi lists {listed} GPUs, {expected} expected "
            "(MXQ_EXPECTED_GPUS); a GPU fallen off the bus or in need of a reset is not listed: see "
            "`nvidia-smi -q` and the kernel log (Xid 79), and reset or reseat it; the launcher "
            "checks again and starts its worker once it is listed")


def remembered(gpu: Unplanned, seen: Mapping[str, object], listed_uuids: set[str]) -> Unplanned:
    """A missing GPU named by what this node's database row for its index remembers (`seen`:
    its info, `uuid` and `name`), where that UUID is not listed now (else the row was another
    GPU's, before the indexes moved): `gpu:3 (GPU-8f6a…, NVIDIA A100 when last seen) is missing`."""
    uuid, name = str(seen.get("uuid") or ""), str(seen.get("name") or "")
    if gpu.cause != "missing" or not uuid or uuid in listed_uuids:
        return gpu
    said = f"{uuid}, {name} when last seen" if name else f"{uuid} when last seen"
    label = gpu.device.label
    return gpu._replace(device=replace(gpu.device, uuid=uuid, name=name),
                        reason=gpu.reason.replace(f"{label} is", f"{label} ({said}) is", 1))
