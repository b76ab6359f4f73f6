"""Options several commands share: a job's turn (`--priority`, `--preemptible`), its time limit
(`--time-limit`), the variants a training builds (`--variants`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mxq.since import parse_duration

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
    """`--time-limit` in seconds (None: unset); a DurationError naming the option otherwise."""
    return None if text is None else parse_duration(text, "--time-limit")
