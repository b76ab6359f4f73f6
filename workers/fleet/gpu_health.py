"""What NVML's signals mean for a GPU's service: pure rules over one reading, no I/O.

A reading (`mxq.workers.fleet.nvml.Nvml.read`) is plain JSON, stored in the worker's row as its
info's `nvml`. The rules follow what the GPU itself says before a job notices:

- a critical Xid event takes the device out, unless it is one of the application's (the
  Kubernetes device plugin's list: 13, 31, 43, 45, 68, 109 are raised by a job's own bad code
  and leave the GPU healthy); Xid 79 (fallen off the bus) is the common one;
- a pending row remap, a row remap that failed, retired pages pending (GPUs before Ampere) or
  uncorrectable ECC errors (volatile: since the driver last loaded) take it out and keep it out:
  they clear only with a GPU reset, so the launcher's probe (a small matmul, which such a GPU
  often passes) does not bring it back while NVML still says so (`sticky`);
- clock event reasons (throttling) and live memory are reported, never acted on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from mxq.json_types import JsonValue

# The application's Xids, as the Kubernetes device plugin skips them: a job's illegal address,
# its kernel's exception, a preemptive cleanup, a stop it asked for. The device stays in service.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# What the common Xids say (NVIDIA's Xid catalogue), for a reason a person reads.
XID_NAMES = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "row remapping event", 64: "row remapping failure",
    68: "video processor exception", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    109: "context switch timeout", 119: "GSP RPC timeout", 120: "GSP error",
}
# nvmlClocksEventReason* bits (named ClocksThrottleReason before driver R535), as reported.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
# How many of the latest Xids a reading keeps: enough to see a pattern, bounded in the row.
KEPT_XIDS = 8

NvmlHealth = Literal["ok", "fault"]


def clock_reasons(mask: int) -> list[str]:
    """The names of the clock event reasons set in `mask` (unknown bits as `bit_0x…`)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + [f"bit_{1 << i:#x}" for i in range(64) if unknown >> i & 1]


def xid_text(xid: int) -> str:
    """`Xid 79 (GPU has fallen off the bus)`: how a reason names an Xid."""
    name = XID_NAMES.get(xid)
    return f"Xid {xid} ({name})" if name else f"Xid {xid}"


def xid_fault(xid: int) -> str | None:
    """Why a critical Xid takes its device out; None for the application's own."""
    if xid in APPLICATION_XIDS:
        return None
    return f"NVML reported critical {xid_text(xid)}"


def sticky(reading: Mapping[str, JsonValue]) -> str | None:
    """Why the GPU must not return to service until a reset clears it (a pending or failed row
    remap, retired pages pending, uncorrectable ECC errors); None when NVML says none of them."""
    ecc = reading.get("ecc_uncorrected")
    if reading.get("row_remap_pending"):
        return "NVML reports a row remap pending (a GPU reset applies it)"
    if reading.get("row_remap_failed"):
        return "NVML reports a row remap failure (the GPU needs service)"
    if reading.get("retired_pages_pending"):
        return "NVML reports retired pages pending (a GPU reset retires them)"
    if isinstance(ecc, int) and ecc > 0:
        return f"NVML reports {ecc} uncorrectable ECC errors since the driver loaded (volatile)"
    return None


def verdict(reading: Mapping[str, JsonValue], new_xids: Iterable[int]) -> str | None:
    """Why the device goes out now: the first critical Xid among those just seen that is not the
    application's, else a sticky condition; None while NVML says nothing against it."""
    for xid in new_xids:
        if (why := xid_fault(xid)) is not None:
            return why
    return sticky(reading)


def health(reason: str | None) -> NvmlHealth:
    """`ok`, or `fault` when NVML gave a reason to take the device out."""
    return "ok" if reason is None else "fault"


def note(reading: JsonValue) -> str:
    """What NVML read, as `mxq devices` says it: `ok` or `fault: REASON`, then the clock event
    reasons holding the clocks down (an idle GPU's own left out); "" where NVML is not read."""
    if not isinstance(reading, dict):
        return ""
    said = f"fault: {reading['reason']}" if reading.get("reason") else "ok"
    clocks = [r for r in listed(reading.get("clock_event_reasons")) if r != "gpu_idle"]
    return f"{said}; clocks: {', '.join(clocks)}" if clocks else said


def listed(value: JsonValue) -> list[str]:
    """A reading's list of names (`clock_event_reasons`) as strings; [] when null or not a list."""
    return [str(v) for v in value] if isinstance(value, list) else []
