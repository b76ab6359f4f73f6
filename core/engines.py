"""Which inference engine runs a job: MXNet, or ONNX Runtime on the model's ONNX export.

Pure: the inference task hands over what the registry stores (the export's agreement with
MXNet, each engine's measured samples/s on this kind of device) and runs what this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A stored JSON record of a version, read key by key (its `onnx` export's: file, agreement,
# max diff), each figure checked where it is read (`as_float`).
Record = Mapping[str, object]
# A version's lower-precision variants by name (`int8`, `fp16`), each its stored record: its
# file, its agreement with full precision and the bound it was quantized with.
Variants = Mapping[str, Record]


def as_float(value: object) -> float:
    """A figure of a stored record (a JSON number) as a float; TypeError for anything else."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"not a number: {value!r}")

ENGINES = ("auto", "mxnet", "onnx")
# ONNX serves `auto` only when it agrees with MXNet on the check batch: every argmax the same
# and no class probability further apart than this.
MAX_DIFF = 1e-4


@dataclass(frozen=True)
class Choice:
    engine: str  # "mxnet" or "onnx"
    reason: str


def figures_key(kind: str, device_model: str | None) -> str:
    """Where a version's engine and precision figures for a device are kept: `cpu`, or
    `gpu:MODEL` (name and compute capability, MXQ_DEVICE_MODEL from the launcher), so that the
    first GPU model measured never decides for another; `gpu` where the model is unknown."""
    return f"{kind}:{device_model}" if kind == "gpu" and device_model else kind


def plain_onnx(onnx: Record | None) -> bool:
    """A version registered from a plain ONNX file (`mxq models add --onnx`): it has no MXNet
    graph, so ONNX Runtime alone serves it, whatever a job asks."""
    return bool(onnx and onnx.get("imported"))


def onnx_only(model: str) -> str:
    """The one-line refusal of MXNet for a plain ONNX version `model` (NAME:VERSION)."""
    return (f"model {model} is a plain ONNX file: it runs on ONNX Runtime only; use --engine onnx "
            "or auto")


def engine_problem(asked: str, onnx: Record | None, model: str) -> str | None:
    """Why a job of `model` cannot run on the engine it asked for (refused at submit), else None."""
    return onnx_only(model) if asked == "mxnet" and plain_onnx(onnx) else None


def disagreement(onnx: Record | None) -> str | None:
    """Why the ONNX export may not serve `auto` (none, or it disagrees), else None."""
    if not onnx or not onnx.get("file"):
        return f"no ONNX export ({(onnx or {}).get('error') or 'not exported'})"
    if as_float(onnx["argmax_agreement"]) < 1.0 or as_float(onnx["max_diff"]) > MAX_DIFF:
        return (f"ONNX disagrees with MXNet (max diff {as_float(onnx['max_diff']):.2g}, "
                f"{onnx.get('measure') or 'argmax agreement'} {as_float(onnx['argmax_agreement']):.2%}; "
                f"allowed {MAX_DIFF:g} and 100%)")
    return None


def needs_measuring(asked: str, onnx: Record | None, speeds: dict[str, float] | None) -> bool:
    """`auto` with an agreeing export and no speeds measured yet on this kind of device."""
    return asked == "auto" and disagreement(onnx) is None and not speeds and not plain_onnx(onnx)


# The engines a device worker may have (`workers/hardware/devices.engines_for`); a job that needs one goes
# to that engine's pool (`pool.<kind>.<engine>`), one that either serves to the kind's pool.
RUNTIMES = ("mxnet", "onnx")


def needed(kind: str, asked: str | None = None, onnx: Record | None = None,
           precision: str | None = None) -> str | None:
    """The engine a job cannot run without, or None when either serves it: training and probes
    run on MXNet; inference on the engine it asked for (ONNX Runtime for a variant), on
    MXNet where the version's ONNX export is missing or disagrees (as `choose` decides), else on
    either."""
    if kind != "infer":
        return "mxnet"
    if precision in VARIANTS or plain_onnx(onnx):
        return "onnx"
    if asked in RUNTIMES:
        return asked
    return "mxnet" if disagreement(onnx) is not None else None


class NoEngine(ValueError):
    """Neither engine may run the job on this device; the message says why and what to do."""


def choose(asked: str, onnx: Record | None, speeds: dict[str, float] | None,
           mxnet_unusable: str | None = None) -> Choice:
    """The engine for a job that asked `asked`: an explicit engine as asked; `auto` the faster
    measured one (MXNet on a tie), MXNet where the export is missing or disagrees. On a device
    MXNet cannot run (`mxnet_unusable` says why), or for a plain ONNX version, only ONNX: NoEngine
    when it cannot serve."""
    if plain_onnx(onnx):
        if asked == "mxnet":
            raise NoEngine("--engine mxnet: the version is a plain ONNX file, which runs on ONNX "
                           "Runtime only; use --engine onnx or auto")
        return Choice("onnx", "asked" if asked == "onnx" else "a plain ONNX file: ONNX Runtime only")
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


def _onnx_only(asked: str, onnx: Record | None, why: str) -> Choice:
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


# Precision (`--precision`): full float32, a lower-precision variant of the ONNX export, or
# `auto`: a variant only where it met the agreement bound the job (or the version, at
# `mxq models quantize --min-agreement`) sets and measured faster on this kind of device.
VARIANTS = ("int8", "fp16")  # the lower precisions a version may have (`mxq models quantize`)
# The variants each kind of device runs. ONNX Runtime's CUDA provider has no kernels for the
# int8 variant's quantized operators (QLinearConv, QGemm, QLinearSoftmax): on a GPU they would
# run node by node on the CPU, and mxq's GPU environments carry no TensorRT. fp16 is a GPU's.
VARIANTS_ON = {"cpu": ("int8", "fp16"), "gpu": ("fp16",)}


def variants_for(kind: str, variants: Variants) -> tuple[Variants, str | None]:
    """The variants a `kind` device runs, and a note naming those it leaves out (None if none)."""
    runs = {n: v for n, v in variants.items() if n in VARIANTS_ON.get(kind, VARIANTS)}
    left = sorted(set(variants) - set(runs))
    if not left:
        return runs, None
    return runs, (f"{' and '.join(left)} not on {kind} devices: ONNX Runtime's CUDA provider has "
                  "no kernels for its quantized operators (they would run on the CPU)")
PRECISIONS = ("auto", "fp32", *VARIANTS)


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # "fp32" or one of VARIANTS
    reason: str


def no_variant(model: str, precision: str = "int8") -> str:
    option = "" if precision == "int8" else f" --precision {precision}"
    return (f"model {model} has no {precision} variant; build one with `mxq models quantize {model} "
            f"--calibration FILE{option}`")


def precision_problem(asked: str | None, min_agreement: float | None,
                      variants: Variants, model: str, engine: str = "auto") -> str | None:
    """Why a job's precision cannot be honoured (the job is refused with it), else None: a
    variant needs to exist and ONNX Runtime to run it; `auto` needs a bound, its own or the
    version's."""
    if asked in VARIANTS:
        if engine == "mxnet":
            return f"--precision {asked} runs on ONNX Runtime: allowed with --engine auto or onnx"
        return no_variant(model, asked) if asked not in variants else None
    if asked == "auto" and min_agreement is None and _version_bound(variants) is None:
        return ("--precision auto needs a bound: --min-agreement 0.99 (or a version quantized with "
                "--min-agreement)")
    if min_agreement is not None and asked != "auto":
        return f"--min-agreement goes with --precision auto (got --precision {asked or 'unset'})"
    return None


def _version_bound(variants: Variants) -> float | None:
    """The bound a version was quantized with, if any of its variants has one."""
    return next((as_float(v["bound"]) for v in variants.values() if v.get("bound") is not None), None)


def _effective(asked: str | None, variants: Variants) -> str | None:
    """A job's precision, unset following the version: `auto` where it was quantized with a
    bound, else None (float32, nothing allowed)."""
    if asked is None and _version_bound(variants) is not None:
        return "auto"
    return asked


def _within(name: str, min_agreement: float | None, variants: Variants) -> str | None:
    """Why the version's variant `name` may not serve `auto` by its agreement (below the bound,
    or quantized with no bound while the job gives none), else None."""
    variant = variants[name]
    bound = min_agreement if min_agreement is not None else variant.get("bound")
    if bound is None:
        return f"{name} variant has no bound (quantized without --min-agreement)"
    agreement = as_float(variant["agreement"])
    if agreement < as_float(bound):
        return f"{name} variant agreement {agreement:.2%} is below the bound {as_float(bound):.2%}"
    return None


def _eligible(min_agreement: float | None, variants: Variants) -> list[str]:
    """The variants of the version whose agreement meets the job's bound (else their own)."""
    return [n for n in VARIANTS if n in variants and _within(n, min_agreement, variants) is None]


def unmeasured(asked: str | None, min_agreement: float | None, variants: Variants,
               speeds: dict[str, float] | None) -> list[str]:
    """For `auto`: the variants within their bound whose speed on this kind of device is not
    known; the job measures them before it chooses."""
    if _effective(asked, variants) != "auto":
        return []
    return [n for n in _eligible(min_agreement, variants) if not (speeds or {}).get(n)]


def choose_precision(asked: str | None, min_agreement: float | None, variants: Variants,
                     speeds: dict[str, float] | None, fp32: str) -> PrecisionChoice:
    """The precision a job runs in, beside `fp32`, the engine chosen for full precision. Unset
    follows the version: `auto` with the bound it was quantized with, else float32. `auto` runs
    the fastest variant whose agreement meets the bound and which measured faster than `fp32`."""
    asked = _effective(asked, variants)
    if asked is None:
        return PrecisionChoice("fp32", "full precision: neither the job nor the version allows a "
                                       "variant (--precision auto --min-agreement)")
    if asked in ("fp32", *VARIANTS):
        return PrecisionChoice(asked, "asked")
    if not variants:
        return PrecisionChoice("fp32", "no lower-precision variant (mxq models quantize)")
    full = (speeds or {}).get(fp32, 0.0)
    why = [w for n in VARIANTS if n in variants and (w := _within(n, min_agreement, variants))]
    faster = _faster(min_agreement, variants, speeds, fp32, why)
    if not faster:
        return PrecisionChoice("fp32", "; ".join(why))
    best = max(faster, key=lambda n: faster[n])
    agreement = as_float(variants[best]["agreement"])
    bound = min_agreement if min_agreement is not None else as_float(variants[best]["bound"])
    why += [f"{n} slower than {best}: {faster[n]:.0f} samples/s" for n in faster if n != best]
    return PrecisionChoice(best, "; ".join([
        f"{best} agreement {agreement:.2%} meets the bound {bound:.2%} and measured faster: "
        f"{faster[best]:.0f} vs {fp32} {full:.0f} samples/s", *why]))


def _faster(min_agreement: float | None, variants: Variants, speeds: dict[str, float] | None,
            fp32: str, why: list[str]) -> dict[str, float]:
    """The variants within their bound that measured faster than `fp32` on this kind of device,
    with their speed; why each other one is not is added to `why`."""
    full = (speeds or {}).get(fp32, 0.0)
    faster: dict[str, float] = {}
    for name in _eligible(min_agreement, variants):
        low = (speeds or {}).get(name, 0.0)
        if not low:
            why.append(f"{name} not measured on this kind of device")
        elif low <= full:
            why.append(f"{name} not faster: {low:.0f} vs {fp32} {full:.0f} samples/s")
        else:
            faster[name] = low
    return faster
