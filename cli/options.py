"""Options several commands share: a job's turn (`--priority`, `--preemptible`)."""

from __future__ import annotations

from typing import Annotated

import typer

PriorityOpt = Annotated[str, typer.Option(
    "--priority", help="high, normal or low: a worker takes a higher level first, first in first "
    "out within one.")]
PreemptibleOpt = Annotated[bool | None, typer.Option(
    "--preemptible/--no-preemptible", help="May yield at a checkpoint to a waiting job of a higher "
    "level, and resume later (default: low jobs only).", show_default=False)]
