"""Device discovery: GPUs from nvidia-smi, else CPU devices, and the MXNet-build compatibility check.

No MXNet import here: the launcher decides what to start before any worker loads MXNet.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from importlib import metadata

QUERY_FIELDS = "index,uuid,name,compute_cap,memory.total,memory.used"
# Compute capabilities (major*10+minor) each MXNet CUDA build carries kernels for.
# mxnet-cu112 1.9.1 ships SASS for these and no PTX, so nothing newer can JIT either.
BUILD_KERNELS: dict[str, tuple[int, ...]] = {
    "mxnet-cu112": (50, 52, 60, 61, 70, 75, 80, 86),
}
BUILD_VERSION = {"mxnet-cu112": "1.9.1"}
NVIDIA_SMI_TIMEOUT = 20


class DeviceError(Exception):
    """A device query or compatibility problem, with a message meant for the user."""


@dataclass(frozen=True)
class Device:
    kind: str  # "gpu" or "cpu"
    index: int  # the host's index: names the device, its queue and its worker
    visible_index: int | None = None  # CUDA's ordinal for it in this process (GPUs)
    name: str = ""
    uuid: str = ""
    compute_cap: str = ""
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}"

    def info(self) -> dict[str, object]:
        return {k: v for k, v in {
            "name": self.name, "uuid": self.uuid, "compute_cap": self.compute_cap,
            "memory_total_mib": self.memory_total_mib, "memory_used_mib": self.memory_used_mib,
        }.items() if v not in ("", None)}


def _mib(value: str) -> int | None:
    value = value.strip()
    if not value or value.startswith("[N/A"):
        return None
    return int(value.split()[0])


def parse_nvidia_smi(text: str) -> list[Device]:
    """Parse `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv` (header line, units in cells)."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    header = [h.split(" [")[0].strip() for h in rows[0]]
    want = QUERY_FIELDS.split(",")
    if header != want:
        raise DeviceError(f"unexpected nvidia-smi header {rows[0]!r}; expected fields {want}")
    gpus = []
    for row in rows[1:]:
        if not row:
            continue
        cells = dict(zip(want, (c.strip() for c in row), strict=True))
        gpus.append(Device(
            kind="gpu", index=int(cells["index"]), visible_index=int(cells["index"]),
            uuid=cells["uuid"], name=cells["name"],
            compute_cap=cells["compute_cap"], memory_total_mib=_mib(cells["memory.total"]),
            memory_used_mib=_mib(cells["memory.used"]),
        ))
    return sorted(gpus, key=lambda d: d.index)


def query_gpus(nvidia_smi: str) -> list[Device]:
    """The GPUs of this host; none when nvidia-smi is absent (a CPU-only host)."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return []
    proc = subprocess.run([exe, f"--query-gpu={QUERY_FIELDS}", "--format=csv"],
                          capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT)
    if proc.returncode != 0:
        # nvidia-smi without a driver (or without GPUs) fails: treat the host as CPU-only.
        return []
    return parse_nvidia_smi(proc.stdout)


def cpu_devices(count: int) -> list[Device]:
    return [Device(kind="cpu", index=i, name=f"CPU device {i}") for i in range(count)]


def relabel(gpus: list[Device], host_ids: list[int]) -> list[Device]:
    """Give the GPUs a container sees the indexes they have on the host."""
    if len(host_ids) != len(gpus):
        raise DeviceError(f"MXQ_HOST_GPUS names {len(host_ids)} GPUs but nvidia-smi shows "
                          f"{len(gpus)}; list one host index per visible GPU")
    return [replace(g, index=h) for g, h in zip(gpus, host_ids, strict=True)]


def discover(nvidia_smi: str, cpu_count: int, host_ids: list[int] | None = None) -> list[Device]:
    """This node's devices: its GPUs, or `cpu_count` CPU devices on a host without any."""
    gpus = query_gpus(nvidia_smi)
    if gpus and host_ids is not None:
        gpus = relabel(gpus, host_ids)
    return gpus or cpu_devices(cpu_count)


def installed_mxnet() -> str | None:
    """The installed MXNet distribution's name (`mxnet`, `mxnet-cu112`, ...), without importing it."""
    for dist in ("mxnet-cu112", *(d for d in BUILD_KERNELS if d != "mxnet-cu112"), "mxnet"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return dist
    return None


def _sm(compute_cap: str) -> int:
    major, _, minor = compute_cap.partition(".")
    return int(major) * 10 + int(minor or 0)


def incompatibility(gpu: Device, build: str | None) -> str | None:
    """Why the installed MXNet build cannot run on `gpu`, or None when it can."""
    if build is None or build == "mxnet":
        return (f"{gpu.label} ({gpu.name}): the installed MXNet is "
                f"{'missing' if build is None else 'the CPU-only build'}; "
                "install the gpu extra (pip install '.[gpu]') to use GPUs")
    kernels = BUILD_KERNELS.get(build)
    if kernels is None or not gpu.compute_cap:
        return None
    sm = _sm(gpu.compute_cap)
    if sm in kernels:
        return None
    arches = ", ".join(f"sm_{k}" for k in kernels)
    return (f"{gpu.label} ({gpu.name}, compute capability {gpu.compute_cap} = sm_{sm}) is not "
            f"supported by the installed {build} {BUILD_VERSION[build]}: it carries kernels "
            f"for {arches} and no PTX, so it cannot run on this GPU; use a GPU of compute "
            f"capability {kernels[0] / 10:.1f}-{kernels[-1] / 10:.1f} or an MXNet build made "
            f"for sm_{sm}")
