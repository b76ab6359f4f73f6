"""Device discovery: GPUs from nvidia-smi, else CPU devices, and the MXNet-build compatibility check.

No MXNet import here: the launcher decides what to start before any worker loads MXNet.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import metadata
from pathlib import Path

from mxq.errors import Unavailable
from mxq.workers.hardware import bounded
from mxq.workers.hardware.kernels import RECORDED, kernels_of

log = logging.getLogger(__name__)

QUERY_FIELDS = ("index", "uuid", "name", "compute_cap", "memory.total", "memory.used",
                "driver_version", "mig.mode.current", "compute_mode")
# Drivers older than R510 do not know `compute_cap`: they are asked again without it.
LEGACY_FIELDS = tuple(f for f in QUERY_FIELDS if f != "compute_cap")
LEGACY_ERROR = 'Field "compute_cap" is not a valid field to query'  # what such a driver says
# `uuid` may be missing (a listing from a tool that leaves it out): such a GPU is pinned by index.
REQUIRED_FIELDS = ("index", "name", "memory.total", "memory.used")
NVIDIA_SMI_TIMEOUT = 20
# Where a GPU host's driver shows its first device; when it exists, a failing nvidia-smi is an error.
DEV_NVIDIA0 = Path("/dev/nvidia0")
# NVRTC from the pinned nvidia-cuda-nvrtc-cu11 11.8 wheel emits PTX that drivers older than R520
# cannot load: MXNet's runtime-compiled (fused) kernels would fail, so fusion is turned off there.
NVRTC_MIN_DRIVER = 520

# A whole GPU's UUID as nvidia-smi prints it (MIG instances' `MIG-…` never reach a worker).
UUID = re.compile(r"GPU-[0-9a-fA-F]+(?:-[0-9a-fA-F]+)*")
# nvidia-smi's compute modes. Under Exclusive_Process one process alone may hold a context on
# the GPU: its worker's, so a training child cannot start there (docs/gpu-hosts.md); under
# Prohibited none may. Exclusive_Thread is what drivers before CUDA 8 called a variant of it.
COMPUTE_MODES = ("Default", "Exclusive_Process", "Exclusive_Thread", "Prohibited")
EXCLUSIVE_PROCESS = "Exclusive_Process"
TIMED_OUT = bounded.TIMED_OUT  # an nvidia-smi run that did not answer in time


class DeviceError(Unavailable):
    """The devices cannot be read or used as configured (nvidia-smi, the driver, MIG)."""


@dataclass(frozen=True)
class DiscoveredDevice:
    """A device this host has, as discovery found it: its label's parts (`label`, as
    `mxq.device.Device` parses a label), and what nvidia-smi says of a GPU, which decides whether
    and how the launcher starts its worker."""

    kind: str  # "gpu" or "cpu"
    index: int  # the host's index: names the device, its queue and its worker
    visible_index: int | None = None  # CUDA's ordinal for it in this process (GPUs)
    name: str = ""
    uuid: str = ""
    compute_cap: str = ""  # "" when the driver does not say
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    driver_version: str = ""
    mig: bool = False  # MIG mode enabled: the GPU is split into instances
    compute_mode: str = ""  # one of COMPUTE_MODES; "" when nvidia-smi does not say
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}"

    @property
    def model(self) -> str:
        """What engine and precision figures are kept per: a GPU's name and compute capability
        (an L4's measurements never decide for an H200), `cpu` for a CPU device."""
        if self.kind != "gpu":
            return self.kind
        return f"{self.name} ({self.compute_cap})" if self.compute_cap else self.name

    @property
    def cuda_id(self) -> str:
        """What its worker's `CUDA_VISIBLE_DEVICES` holds: the GPU's UUID, which names that exact
        GPU whatever order CUDA and NVML count GPUs in; its index (in PCI bus order, as
        `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA count) only where nvidia-smi gave no UUID."""
        if self.kind != "gpu":
            return ""
        return self.uuid or str(self.visible_index)

    @property
    def driver_major(self) -> int | None:
        head = self.driver_version.split(".")[0]
        return int(head) if head.isdigit() else None

    def info(self) -> dict[str, object]:
        return {k: v for k, v in {
            "name": self.name, "uuid": self.uuid, "cuda_visible_devices": self.cuda_id,
            "compute_cap": self.compute_cap, "compute_mode": self.compute_mode,
            "memory_total_mib": self.memory_total_mib, "memory_used_mib": self.memory_used_mib,
            "driver_version": self.driver_version,
        }.items() if v not in ("", None)}


def _value(cell: str) -> str:
    """The cell, or "" for what nvidia-smi prints in place of a value it cannot give:
    `[N/A]`, `[Not Supported]`, `[Unknown Error]`, `[GPU requires reset]`, `[Insufficient Permissions]`…"""
    cell = cell.strip()
    return "" if cell.startswith("[") and cell.endswith("]") else cell


def _mib(cell: str) -> int | None:
    value = _value(cell)
    head = value.split()[0] if value else ""
    return int(head) if head.isdigit() else None


def _compute_cap(cell: str) -> str:
    value = _value(cell)
    major, dot, minor = value.partition(".")
    return value if major.isdigit() and dot and minor.isdigit() else ""


def _uuid(cell: str, line: int) -> str:
    """The GPU's UUID, which its worker is pinned by; "" when nvidia-smi gives none (pinned by
    index then). DeviceError for one CUDA_VISIBLE_DEVICES would not take as that GPU's."""
    value = _value(cell)
    if value and not UUID.fullmatch(value):
        raise DeviceError(f"nvidia-smi line {line} gives GPU UUID {_cut(value)}: expected GPU- "
                          "and hexadecimal digits in dash-separated groups (GPU-8f6a3c1e-5b2d-...), "
                          "which CUDA_VISIBLE_DEVICES takes; check the GPU with `nvidia-smi -q`")
    return value


def _compute_mode(cell: str, line: int) -> str:
    """The GPU's compute mode, "" when nvidia-smi does not say; DeviceError for one it has no
    name for here (what it allows is decided by it: mxq must not guess)."""
    value = _value(cell)
    if value and value not in COMPUTE_MODES:
        raise DeviceError(f"nvidia-smi line {line} gives compute mode {_cut(value)}: expected one of "
                          f"{', '.join(COMPUTE_MODES)}; check the GPU with `nvidia-smi -q -d COMPUTE`")
    return value


def _row(cells: dict[str, str], line: int) -> DiscoveredDevice:
    index = _value(cells["index"])
    if not index.isdigit():
        raise DeviceError(f"nvidia-smi line {line} gives GPU index {cells['index']!r}: the GPU "
                          "cannot be addressed; check it with `nvidia-smi -q`")
    return DiscoveredDevice(
        kind="gpu", index=int(index), visible_index=int(index), uuid=_uuid(cells.get("uuid", ""), line),
        name=_value(cells["name"]), compute_cap=_compute_cap(cells.get("compute_cap", "")),
        memory_total_mib=_mib(cells["memory.total"]), memory_used_mib=_mib(cells["memory.used"]),
        driver_version=_value(cells.get("driver_version", "")),
        mig=_value(cells.get("mig.mode.current", "")).lower() == "enabled",
        compute_mode=_compute_mode(cells.get("compute_mode", ""), line),
    )


def parse_nvidia_smi(text: str, lenient: bool = False) -> list[DiscoveredDevice]:
    """Parse `nvidia-smi --query-gpu=<fields> --format=csv` (header line with units, cells with
    units); the fields may come in any order, those beyond REQUIRED_FIELDS may be missing.
    `lenient`: what an nvidia-smi that failed part-way printed: lines before the header and
    rows that cannot be used (an error where a GPU's row would be) are skipped."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    start = next((i for i, r in enumerate(rows) if set(REQUIRED_FIELDS) <= set(_fields(r))),
                 None) if lenient else 0
    if not rows or start is None:
        return []
    header = _fields(rows[start])
    if not set(REQUIRED_FIELDS) <= set(header):
        raise DeviceError(f"unexpected nvidia-smi header {rows[0]!r}; expected fields "
                          f"{list(QUERY_FIELDS)}")
    gpus = []
    for line, row in enumerate(rows[start + 1:], start=start + 2):
        try:
            if not row:
                continue
            if len(row) != len(header):
                raise DeviceError(f"nvidia-smi line {line} has {len(row)} fields, its header "
                                  f"{len(header)}: {', '.join(row)!r}")
            gpus.append(_row(dict(zip(header, row, strict=True)), line))
        except DeviceError:
            if not lenient:
                raise
    return sorted(gpus, key=lambda d: d.index)


def _fields(row: list[str]) -> list[str]:
    return [h.split(" [")[0].strip() for h in row]


def _run(exe: str, fields: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """nvidia-smi's query, bounded by NVIDIA_SMI_TIMEOUT whatever it does: what it printed before
    it hung is kept, so the GPUs it listed start (`bounded.run`)."""
    return bounded.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv"], NVIDIA_SMI_TIMEOUT)


def _besides_rows(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """`proc` with only what its output says besides the GPUs' rows and their header (the
    error of the GPU it could not list), for the message of a partial failure."""
    said = [ln for ln in proc.stdout.splitlines()
            if ln.strip() and not ln.split(",")[0].strip().isdigit() and not ln.startswith("index")]
    return subprocess.CompletedProcess(proc.args, proc.returncode, "\n".join(said), proc.stderr)


def _failure(proc: subprocess.CompletedProcess[str]) -> str:
    said = " ".join((proc.stderr or proc.stdout or "").split()) or "nothing"
    status = "timed out" if proc.returncode == TIMED_OUT else f"exited with {proc.returncode}"
    return f"`{' '.join(proc.args)}` {status}: {said[:300]}"


def query_gpus(nvidia_smi: str, expect_gpus: bool = False) -> list[DiscoveredDevice]:
    """The GPUs of this host; none when nvidia-smi is absent (a CPU-only host).

    An nvidia-smi that fails after listing some GPUs (one fell off the bus: the others' rows,
    then an error, a non-zero exit) gives those it listed, with a warning naming the failure: a
    lost GPU takes itself out, not the node. One that fails or hangs listing none is an error
    where GPUs are expected (MXQ_EXPECT_GPUS, or /dev/nvidia0 exists), else a warning before the
    host runs CPU devices."""
    exe = shutil.which(nvidia_smi)
    expected = expect_gpus or DEV_NVIDIA0.exists()
    if exe is None:
        if expect_gpus:
            raise DeviceError(f"GPUs are expected (MXQ_EXPECT_GPUS) but there is no {nvidia_smi!r} "
                              "program: install the NVIDIA driver or set MXQ_NVIDIA_SMI")
        return []
    proc = _run(exe, QUERY_FIELDS)
    if proc.returncode != 0 and LEGACY_ERROR in (proc.stderr + proc.stdout):
        proc = _run(exe, LEGACY_FIELDS)  # a driver older than R510, and only that
    if proc.returncode == 0:
        return parse_nvidia_smi(proc.stdout)
    if listed := parse_nvidia_smi(proc.stdout, lenient=True):
        log.warning("mxq: %s after listing %s: those start; a GPU it did not list (fallen off the "
                    "bus, in need of a reset) is left out until nvidia-smi lists it again",
                    _failure(_besides_rows(proc)), ", ".join(f"{g.label} ({g.name})" for g in listed))
        return listed
    if expected:
        raise DeviceError(f"nvidia-smi failed on a host with GPUs: {_failure(proc)}; fix the driver, "
                          "or unset MXQ_EXPECT_GPUS to run CPU devices")
    log.warning("mxq: nvidia-smi failed, so no GPU is used and CPU devices start: %s", _failure(proc))
    return []


def cpu_devices(count: int) -> list[DiscoveredDevice]:
    return [DiscoveredDevice(kind="cpu", index=i, name=f"CPU device {i}") for i in range(count)]


def relabel(gpus: list[DiscoveredDevice], host_ids: list[int]) -> list[DiscoveredDevice]:
    """Give the GPUs a container sees the indexes they have on the host."""
    if len(host_ids) != len(gpus):
        raise DeviceError(f"MXQ_HOST_GPUS names {len(host_ids)} GPUs but nvidia-smi shows "
                          f"{len(gpus)}; list one host index per visible GPU")
    return [replace(g, index=h) for g, h in zip(gpus, host_ids, strict=True)]


def visible(gpus: list[DiscoveredDevice], wanted: str | None) -> list[DiscoveredDevice]:
    """The GPUs `CUDA_VISIBLE_DEVICES` (`wanted`) lets this host's mxq use, in its order, as
    dask-cuda and Ray honour it: nvidia-smi indexes (mxq pins in PCI bus order) or UUIDs (a
    unique prefix, `GPU-8932f937`); CUDA stops at the first negative entry, so `-1` or an empty
    value means none. None (unset): every GPU. DeviceError for an entry that is no GPU here."""
    if wanted is None:
        return gpus
    chosen: list[DiscoveredDevice] = []
    for entry in (e.strip() for e in wanted.split(",")):
        if not entry or entry.startswith("-"):
            break
        gpu = _visible_entry(gpus, entry, wanted)
        if gpu in chosen:
            raise DeviceError(f"CUDA_VISIBLE_DEVICES={_cut(wanted)} names GPU {entry} twice; list "
                              "each GPU once")
        chosen.append(gpu)
    return chosen


def _visible_entry(gpus: list[DiscoveredDevice], entry: str, wanted: str) -> DiscoveredDevice:
    found = [g for g in gpus if (str(g.visible_index) == entry if entry.isdigit()
                                 else bool(g.uuid) and g.uuid.lower().startswith(entry.lower()))]
    if len(found) == 1:
        return found[0]
    shown = ", ".join(f"{g.visible_index} ({g.uuid or g.name})" for g in gpus) or "none"
    why = "matches several GPUs" if found else "is no GPU of this host"
    raise DeviceError(f"CUDA_VISIBLE_DEVICES={_cut(wanted)}: {_cut(entry)} {why}; nvidia-smi shows "
                      f"{shown}: list their indexes or UUIDs (comma-separated), or unset it to use "
                      "every GPU")


def _cut(text: str, most: int = 60) -> str:
    """A value from outside, quoted and cut short for a one-line message."""
    return repr(text if len(text) <= most else text[:most] + "...")


def discover(nvidia_smi: str, cpu_count: int, host_ids: list[int] | None = None,
             expect_gpus: bool = False, cuda_visible: str | None = None) -> list[DiscoveredDevice]:
    """This node's devices: its GPUs (those `CUDA_VISIBLE_DEVICES` lets it use), or `cpu_count`
    CPU devices on a host without any (or with none of them visible)."""
    return visible(host_gpus(nvidia_smi, host_ids, expect_gpus), cuda_visible) or cpu_devices(cpu_count)


def host_gpus(nvidia_smi: str, host_ids: list[int] | None = None,
              expect_gpus: bool = False) -> list[DiscoveredDevice]:
    """Every GPU nvidia-smi lists, named by its host index (MXQ_HOST_GPUS in a container)."""
    gpus = query_gpus(nvidia_smi, expect_gpus)
    return relabel(gpus, host_ids) if gpus and host_ids is not None else gpus


@cache
def installed(dist: str) -> bool:
    """Whether the distribution `dist` is installed, without importing it; asked once per process
    (what is installed does not change while it runs, and a worker asks for every small job it
    may batch)."""
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def installed_mxnet() -> str | None:
    """The installed MXNet distribution's name (`mxnet`, `mxnet-cu112`, ...), without importing it."""
    return next((dist for dist in (*RECORDED, "mxnet") if installed(dist)), None)


def onnx_runs_gpus() -> bool:
    """Whether the installed ONNX Runtime is the GPU build (`onnxruntime-gpu`, the gpu-onnx
    extra), without importing it."""
    return installed("onnxruntime-gpu")


def onnx_installed() -> bool:
    """Whether any ONNX Runtime build is installed (the CPU one of the cpu extra, or the GPU
    one, which runs CPU devices too), without importing it."""
    return installed("onnxruntime") or installed("onnxruntime-gpu")


def engines_for(kind: str, mxnet_unusable: str | None = None) -> tuple[str, ...]:
    """The engines a device of `kind` runs with what this host has installed: MXNet unless it
    cannot run the device (`mxnet_unusable`, or no MXNet at all), ONNX Runtime where its build
    for that kind is installed (a GPU needs the gpu-onnx extra's onnxruntime-gpu)."""
    mxnet = installed_mxnet() is not None and mxnet_unusable is None
    onnx = onnx_runs_gpus() if kind == "gpu" else onnx_installed()
    return tuple(e for e, has in (("mxnet", mxnet), ("onnx", onnx)) if has)


def _sm(compute_cap: str) -> int:
    major, _, minor = compute_cap.partition(".")
    return int(major) * 10 + int(minor or 0)


def _arches(codes: tuple[int, ...]) -> str:
    return ", ".join(f"sm_{c}" for c in codes) or "none"


def compute_mode_refusal(gpu: DiscoveredDevice) -> str | None:
    """Why `gpu`'s compute mode lets no mxq worker use it (Prohibited: no process may), or None."""
    if gpu.compute_mode != "Prohibited":
        return None
    return (f"{gpu.label} ({gpu.name}) is in the Prohibited compute mode: no process may use it; "
            f"set the Default compute mode (`nvidia-smi -i {gpu.index} -c DEFAULT`) to use it")


def incompatibility(gpu: DiscoveredDevice, build: str | None) -> str | None:
    """Why the installed MXNet build cannot run on `gpu`, or None when it can."""
    if gpu.mig:
        return (f"{gpu.label} ({gpu.name}) has MIG mode enabled: mxq pins whole GPUs, one worker "
                f"each; disable MIG (`nvidia-smi -i {gpu.index} -mig 0`, then reset the GPU) to use it")
    if build is None or build == "mxnet":
        return (f"{gpu.label} ({gpu.name}): the installed MXNet is "
                f"{'missing' if build is None else 'the CPU-only build'}; "
                "install the gpu extra (pip install '.[gpu]') to use GPUs")
    kernels = kernels_of(build)
    if kernels is None or not gpu.compute_cap:
        return None  # an unknown build, or a driver that does not say: the worker finds out
    sm = _sm(gpu.compute_cap)
    if kernels.runs_on(sm):
        return None
    ptx = f"PTX only for {_arches(kernels.ptx)}" if kernels.ptx else "no PTX"
    return (f"{gpu.label} ({gpu.name}, compute capability {gpu.compute_cap} = sm_{sm}) cannot run "
            f"the installed {build} {kernels.version}: it carries SASS for {_arches(kernels.sass)} "
            f"(each runs on GPUs of its major version at an equal or higher minor) and {ptx} the "
            f"driver could compile for sm_{sm}: MXNet trains on GPUs of compute capability "
            f"{kernels.span()}; ONNX Runtime (the gpu-onnx extra) can serve inference on this one")


# A GPU whose memory is more than half in use when its worker would start is held by
# another process (a stranger's training): its worker would run out of memory at every job.
BUSY_MEMORY_SHARE = 0.5


def memory_busy(gpu: DiscoveredDevice) -> str | None:
    """Why `gpu` is refused for memory another process holds, or None (figures unknown: start)."""
    used, total = gpu.memory_used_mib, gpu.memory_total_mib
    if gpu.kind != "gpu" or used is None or not total or used <= BUSY_MEMORY_SHARE * total:
        return None
    return (f"{gpu.label} ({gpu.name}): {used} MiB of its {total} MiB are in use by other "
            f"processes (more than {BUSY_MEMORY_SHARE:.0%}); see `nvidia-smi` for which, and "
            "start mxq on it once they end (or hide it with CUDA_VISIBLE_DEVICES)")


# The gpu-onnx extra's CUDA 12.9 wheels: their libraries run on R525 and newer (CUDA 12's
# minor-version compatibility), the PTX NVRTC 12.9 emits at run time only on R575 and newer.
ONNX_MIN_DRIVER, ONNX_NVRTC_DRIVER = 525, 575


def onnx_driver_gate(gpu: DiscoveredDevice) -> tuple[str | None, str | None]:
    """For a GPU ONNX Runtime (gpu-onnx) would serve: why its driver refuses it, else a warning
    when the driver runs the libraries but not what NVRTC 12.9 compiles; (None, None) when fine
    or the driver does not say."""
    major = gpu.driver_major
    if major is None or major >= ONNX_NVRTC_DRIVER:
        return None, None
    if major < ONNX_MIN_DRIVER:
        return (f"{gpu.label} ({gpu.name}): driver {gpu.driver_version} is older than R{ONNX_MIN_DRIVER}, "
                "which the gpu-onnx extra's CUDA 12 libraries need; upgrade the driver (R"
                f"{ONNX_NVRTC_DRIVER}+) to serve it with ONNX Runtime"), None
    return None, (f"{gpu.label} ({gpu.name}): driver {gpu.driver_version} runs the gpu-onnx extra's "
                  f"CUDA 12.9 libraries (R{ONNX_MIN_DRIVER}+) but not the code NVRTC 12.9 compiles at "
                  f"run time (R{ONNX_NVRTC_DRIVER}+): an ONNX Runtime operator that compiles a kernel "
                  f"fails there; upgrade the driver to R{ONNX_NVRTC_DRIVER} or newer")


def fusion_off(gpu: DiscoveredDevice) -> bool:
    """True when the driver is too old for the PTX that NVRTC 11.8 emits (MXNet's fused kernels)."""
    major = gpu.driver_major
    return major is not None and major < NVRTC_MIN_DRIVER
