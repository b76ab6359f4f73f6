"""Options several commands share: a job's turn (`--priority`, `--preemptible`), its time limit
(`--time-limit`), the jobs it waits for (`--after`), the variants a training builds
(`--variants`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mxq import since
from mxq.json_types import JsonObject

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
KeyOpt = Annotated[str | None, typer.Option(
    "--idempotency-key", help="Makes a retry safe: a submit with a key used before shows the job "
    "that first submit made instead of queuing another (a UUID fits).")]
PriorityOpt = Annotated[str, typer.Option(
    "--priority", help="high, normal or low: a worker takes a higher level first, first in first "
    "out within one.")]
TeamOpt = Annotated[str | None, typer.Option(
    "--team", help="Share with this team (`mxq teams`): its members read the results. Default: "
    "the owner alone (and admins).")]
PreemptibleOpt = Annotated[bool | None, typer.Option(
    "--preemptible/--no-preemptible", help="May yield at a checkpoint to a waiting job of a higher "
    "level, and resume later (default: low jobs only).", show_default=False)]
VariantsOpt = Annotated[str, typer.Option(
    "--variants", help="With --calibration: the variants built, int8 and/or fp16, comma-separated "
    "(as mxq models quantize --precision).")]


def parse_variants(text: str) -> list[str]:
    """`int8,fp16` as a list, each once; the job's parameters check the names."""
    return list(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))


TimeLimitOpt = Annotated[str | None, typer.Option(
    "--time-limit", help="The most the job may run (90s, 45m, 2h, 1h30m or seconds), counted from "
    "its first start across attempts; past it the job stops at its next checkpoint (a committed "
    "flush, an epoch's checkpoint), keeps what it committed and fails naming the limit.",
    show_default=False)]


def parse_time_limit(text: str | None) -> int | None:
    """`--time-limit` in seconds (None: unset); a DurationError naming the option otherwise,
    before anything is submitted (as the API's schema refuses it: no failed job recorded)."""
    if text is None:
        return None
    return since.parse_time_limit(text, "--time-limit")


AfterOpt = Annotated[str | None, typer.Option(
    "--after", metavar="JOB[,JOB…]", help="Wait until these jobs succeeded (Slurm's afterok): the "
    "job runs then, and fails naming the one that did not if one fails or is cancelled.",
    show_default=False)]


def parse_after(text: str | None) -> list[int] | None:
    """`--after 12,15` as job ids (None: unset); BadParameter naming the value otherwise (the
    submit checks each id: it exists, the user may read it, at most 64)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdecimal() and p.isascii() for p in parts):
        bad = next(p for p in parts if not (p.isdecimal() and p.isascii()))
        raise typer.BadParameter(f"{bad[:40]!r} in {text[:80]!r}: expected job ids, comma-separated "
                                 "(--after 12,15)", param_hint="--after")
    return [int(p) for p in parts]


ScaleOpt = Annotated[str | None, typer.Option(
    "--scale", help="Multiply inputs by this first: 1/255 or 0.5.")]
MeanOpt = Annotated[str | None, typer.Option(
    "--mean", help="Then subtract: one value, or one per channel (R,G,B).")]
StdOpt = Annotated[str | None, typer.Option(
    "--std", help="Then divide by: one value, or one per channel.")]
LayoutOpt = Annotated[str | None, typer.Option(
    "--layout", help="NCHW (default) or NHWC: where the channels are.")]
FromOpt = Annotated[str | None, typer.Option(
    "--from", help="Retrain a registered model's own graph, NAME or NAME:VERSION (default: its "
    "promoted version), instead of an architecture.")]
ReinitOpt = Annotated[bool, typer.Option(
    "--reinit", help="With --from: train the graph from fresh weights.")]


def preprocess_fields(scale: str | None, mean: str | None, std: str | None,
                      layout: str | None) -> JsonObject:
    """A training's --scale/--mean/--std/--layout as request fields (None where not given), read
    as `mxq models add` reads them (1/255, 0.485,0.456,0.406)."""
    from mxq.preprocess import Preprocess

    prep = Preprocess.parse(scale, mean, std, layout)
    return {"scale": None if scale is None else prep.scale,
            "mean": None if prep.mean is None else list(prep.mean),
            "std": None if prep.std is None else list(prep.std),
            "layout": None if layout is None else prep.layout}


def from_fields(source: str | None) -> JsonObject:
    """`--from NAME[:VERSION]` as request fields (the job's parameters check the name)."""
    if source is None:
        return {"from_model": None, "from_version": None}
    name, _, version = source.partition(":")
    if version and not version.isdigit():
        raise typer.BadParameter(f"{source!r}: expected NAME or NAME:VERSION (VERSION a number, "
                                 "as in mycnn:3)", param_hint="--from")
    return {"from_model": name, "from_version": int(version) if version else None}
