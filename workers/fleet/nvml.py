"""What a GPU worker's heartbeat reads of its GPU through NVML (`nvidia-ml-py`, module `pynvml`).

Each beat reads the GPU's live memory, its uncorrectable ECC errors (volatile), its row remap
state (retired pages pending on GPUs before Ampere), its clock event reasons, and the critical
Xid events since the last beat (an event set polled with a zero timeout, never waiting); the
rules of `mxq.workers.fleet.gpu_health` decide what they mean. NVML is optional: without
`pynvml` (the `cpu` extra), without a driver (nvmlInit fails) or without the GPU in NVML, the
worker reads nothing and says why in one log line, once; a field the GPU does not support
(ECC off, no row remapper) is null, never an error.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from mxq.json_types import JsonObject, JsonValue
from mxq.workers.fleet import gpu_health

log = logging.getLogger(__name__)

# Events polled at most per beat: a storm of Xids must not hold a beat back.
MAX_EVENTS_PER_BEAT = 64
# NVML's answers that say "this GPU has no such counter" rather than "something is wrong".
_UNSUPPORTED = {"NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"}


def target(kind: str, visible: str | None) -> int | str | None:
    """The NVML device of a worker's GPU: its own CUDA_VISIBLE_DEVICES (set by the launcher)
    as an index (with CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's numbering) or a UUID; None for a
    CPU device or a GPU worker without one."""
    value = (visible or "").strip()
    if kind != "gpu" or not value or "," in value:
        return None
    return int(value) if value.isdigit() else value


_library: ModuleType | None = None
_tried = False


def library() -> ModuleType | None:
    """`pynvml`, initialised once per process; None (said once in the log) when NVML is absent."""
    global _library, _tried
    if _tried:
        return _library
    _tried = True
    try:
        lib = importlib.import_module("pynvml")
    except ImportError as exc:
        log.info("NVML not read: %s (the gpu and gpu-onnx extras install nvidia-ml-py)", exc)
        return None
    try:
        lib.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, an OSError: any
        log.warning("NVML not read: nvmlInit failed (%s: %s)", type(exc).__name__, exc)
        return None
    _library = lib
    return lib


class Nvml:
    """One GPU as NVML sees it, read at each beat; remembers the Xids it saw and the first
    reason it found to take the device out (an Xid is delivered once, its verdict stays)."""

    def __init__(self, lib: ModuleType, handle: object, label: str) -> None:
        self.lib, self.handle, self.label = lib, handle, label
        self.events = self._event_set()
        self.xids: list[int] = []
        self.fault: str | None = None
        self._complained: set[str] = set()
        self._clock_call = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            lib.nvmlDeviceGetCurrentClocksThrottleReasons  # before nvidia-ml-py 12.535

    def _event_set(self) -> Any:
        """An event set for this GPU's critical Xids; None where it has none (said once)."""
        lib = self.lib
        try:
            events = lib.nvmlEventSetCreate()
            lib.nvmlDeviceRegisterEvents(self.handle, lib.nvmlEventTypeXidCriticalError, events)
        except lib.NVMLError as exc:
            log.warning("NVML: %s: Xid events not read (%s)", self.label, exc)
            return None
        return events

    def read(self) -> JsonObject:
        """The GPU's state now, with `health` (`ok`, `fault`) and `reason` (why it is out)."""
        new = self._new_xids()
        self.xids = (self.xids + new)[-gpu_health.KEPT_XIDS:]
        used, total = self._memory()
        reading: JsonObject = {
            "memory_used_mib": used, "memory_total_mib": total,
            "ecc_uncorrected": self._ecc(),
            **self._remaps(), "clock_event_reasons": self._clock_reasons(), "xids": list(self.xids),
        }
        self.fault = self.fault or gpu_health.verdict(reading, new)
        return {**reading, "health": gpu_health.health(self.fault), "reason": self.fault}

    def sticky(self) -> str | None:
        """Why this GPU may not return to service now (NVML's sticky conditions only)."""
        return gpu_health.sticky({**self._remaps(), "ecc_uncorrected": self._ecc()})

    def _new_xids(self) -> list[int]:
        """The critical Xids since the last beat (a zero timeout: NVML answers Timeout at once
        when there is none)."""
        if self.events is None:
            return []
        seen: list[int] = []
        for _ in range(MAX_EVENTS_PER_BEAT):
            try:
                data = self.lib.nvmlEventSetWait(self.events, 0)
            except self.lib.NVMLError as exc:
                if exc.value != self.lib.NVML_ERROR_TIMEOUT:
                    self._complain("Xid events", exc)
                break
            if data.eventType & self.lib.nvmlEventTypeXidCriticalError:
                seen.append(int(data.eventData))
        return seen

    def _ecc(self) -> int | None:
        """Uncorrectable ECC errors since the driver loaded (volatile); None with ECC off."""
        count = self._ask(self.lib.nvmlDeviceGetTotalEccErrors, "ECC errors",
                          self.lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.lib.NVML_VOLATILE_ECC)
        return None if count is None else int(count)

    def _memory(self) -> tuple[int | None, int | None]:
        info = self._ask(self.lib.nvmlDeviceGetMemoryInfo, "memory")
        if info is None:
            return None, None
        return int(info.used) // 2**20, int(info.total) // 2**20

    def _remaps(self) -> JsonObject:
        """Row remapping (Ampere and later); retired pages pending where the GPU has none."""
        rows = self._ask(self.lib.nvmlDeviceGetRemappedRows, "row remapping")
        if rows is not None:
            return {"row_remap_pending": bool(rows[2]), "row_remap_failed": bool(rows[3])}
        pending = self._ask(self.lib.nvmlDeviceGetRetiredPagesPendingStatus, "retired pages")
        return {"retired_pages_pending": None if pending is None
                else pending == self.lib.NVML_FEATURE_ENABLED}

    def _clock_reasons(self) -> JsonValue:
        mask = self._ask(self._clock_call, "clock event reasons")
        return None if mask is None else [*gpu_health.clock_reasons(int(mask))]

    def _ask(self, call: Callable[..., Any], what: str, *args: object) -> Any:
        """`call(handle, *args)`, or None when the GPU does not support it or NVML failed (said
        once per `what`). Any: pynvml has no types (a ctypes structure, a tuple, an int)."""
        try:
            return call(self.handle, *args)
        except self.lib.NVMLError as exc:
            code = _code_name(self.lib, exc)
            if code == "NVML_ERROR_GPU_IS_LOST":
                self.fault = self.fault or f"NVML reports the GPU is lost (reading its {what})"
            elif code not in _UNSUPPORTED:
                self._complain(what, exc)
            return None

    def _complain(self, what: str, exc: Exception) -> None:
        if what not in self._complained:
            self._complained.add(what)
            log.warning("NVML: %s: reading its %s failed (%s); left out", self.label, what, exc)


def _code_name(lib: ModuleType, exc: Exception) -> str:
    """The NVML_ERROR_* name of an NVMLError's code (`?` when unknown)."""
    return _error_names(lib).get(getattr(exc, "value", None), "?")


@functools.cache  # an unsupported counter fails every beat: the module's names are read once
def _error_names(lib: ModuleType) -> dict[object, str]:
    names: dict[object, str] = {}
    for n in dir(lib):
        if n.startswith("NVML_ERROR_"):
            names.setdefault(getattr(lib, n), n)  # the first name of a code, as dir() orders them
    return names


@functools.cache  # once per process: the start check and the heartbeat read one event set
def open_gpu(kind: str, visible: str | None, label: str) -> Nvml | None:
    """This worker's GPU in NVML, or None (said once) when NVML is absent or does not know it."""
    where = target(kind, visible)
    if where is None:
        return None
    lib = library()
    if lib is None:
        return None
    try:
        if isinstance(where, int):
            handle = lib.nvmlDeviceGetHandleByIndex(where)
        else:
            handle = lib.nvmlDeviceGetHandleByUUID(where)
    except lib.NVMLError as exc:
        log.warning("NVML not read for %s: no NVML device %r (%s)", label, where, exc)
        return None
    return Nvml(lib, handle, label)
