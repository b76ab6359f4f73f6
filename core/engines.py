"""Which inference engine runs a job: MXNet, or ONNX Runtime on the model's ONNX export.

Pure: the inference task hands over what the registry stores (the export's agreement with
MXNet, each engine's measured samples/s on this kind of device) and runs what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENGINES = ("auto", "mxnet", "onnx")
# ONNX serves `auto` only when it agrees with MXNet on the check batch: every argmax the same
# and no class probability further apart than this.
MAX_DIFF = 1e-4


@dataclass(frozen=True)
class Choice:
    engine: str  # "mxnet" or "onnx"
    reason: str


def disagreement(onnx: dict[str, Any] | None) -> str | None:
    """Why the ONNX export may not serve `auto` (none, or it disagrees), else None."""
    if not onnx or not onnx.get("file"):
        return f"no ONNX export ({(onnx or {}).get('error') or 'not exported'})"
    if onnx["argmax_agreement"] < 1.0 or onnx["max_diff"] > MAX_DIFF:
        return (f"ONNX disagrees with MXNet (max diff {onnx['max_diff']:.2g}, argmax agreement "
                f"{onnx['argmax_agreement']:.2%}; allowed {MAX_DIFF:g} and 100%)")
    return None


def needs_measuring(asked: str, onnx: dict[str, Any] | None, speeds: dict[str, float] | None) -> bool:
    """`auto` with an agreeing export and no speeds measured yet on this kind of device."""
    return asked == "auto" and disagreement(onnx) is None and not speeds


# The engines a device worker may have (`workers/hardware/devices.engines_for`); a job that needs one goes
# to that engine's pool (`pool.<kind>.<engine>`), one that either serves to the kind's pool.
RUNTIMES = ("mxnet", "onnx")


def needed(kind: str, asked: str | None = None, onnx: dict[str, Any] | None = None) -> str | None:
    """The engine a job cannot run without, or None when either serves it: training and probes
    run on MXNet; inference on the engine it asked for, on MXNet where the version's ONNX export
    is missing or disagrees (as `choose` decides), else on either."""
    if kind != "infer":
        return "mxnet"
    if asked in RUNTIMES:
        return asked
    return "mxnet" if disagreement(onnx) is not None else None


class NoEngine(ValueError):
    """Neither engine may run the job on this device; the message says why and what to do."""


def choose(asked: str, onnx: dict[str, Any] | None, speeds: dict[str, float] | None,
           mxnet_unusable: str | None = None) -> Choice:
    """The engine for a job that asked `asked`: an explicit engine as asked; `auto` the faster
    measured one (MXNet on a tie), MXNet where the export is missing or disagrees. On a device
    MXNet cannot run (`mxnet_unusable` says why) only ONNX: NoEngine when it cannot serve."""
    if mxnet_unusable is not None:
        return _onnx_only(asked, onnx, mxnet_unusable)
    if asked in ("mxnet", "onnx"):
        return Choice(asked, "asked")
    if (why := disagreement(onnx)) is not None:
        return Choice("mxnet", why)
    if not speeds:
        return Choice("mxnet", "no speeds measured")
    mxnet, onnx_rate = speeds.get("mxnet", 0.0), speeds.get("onnx", 0.0)
    winner = "onnx" if onnx_rate > mxnet else "mxnet"
    return Choice(winner, f"measured faster: onnx {onnx_rate:.0f} vs mxnet {mxnet:.0f} samples/s")


def _onnx_only(asked: str, onnx: dict[str, Any] | None, why: str) -> Choice:
    if asked == "mxnet":
        raise NoEngine(f"--engine mxnet cannot run here: {why}")
    if asked == "onnx":
        return Choice("onnx", "asked")
    problem = disagreement(onnx)
    if problem is None:
        return Choice("onnx", "MXNet cannot run this device")
    if onnx and onnx.get("file"):  # exported, but it disagrees: only an explicit ask runs it
        raise NoEngine(f"{problem}, and MXNet cannot run this device ({why}); pass --engine onnx "
                       "to run the ONNX export anyway")
    raise NoEngine(f"{problem}, and MXNet cannot run this device ({why})")
