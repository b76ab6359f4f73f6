"""A middleware around a job's run: what it sees of the run, and the two calls it answers.

The runner calls every middleware's `before` once the job is claimed, and every one's `after` once the
run ended however it ended (its outcome recorded, or an exception on its way out), in reverse
order; one `after` that raises does not keep the others from running. A `before` that raises
ends the run there: those started before it get their `after`, it and those after it none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from mxq.workers.fleet.heartbeat import Heartbeat
from mxq.workers.settings import Settings


@dataclass(frozen=True)
class Run:
    """One claimed run of a job, as the middleware around it sees it."""

    job_id: int
    parent_id: int | None  # the job it is a chunk (or a node's part) of
    settings: Settings  # its worker's
    heartbeat: Heartbeat | None  # its worker process's (None: a simulated worker)
    attempt: int = 0  # its claim's (`Fence.attempt`)
    worker: str = ""  # the worker that claimed it
    devices: tuple[str, ...] = ()  # what it runs on (a training's leased devices)


class Middleware(Protocol):
    def before(self, run: Run) -> None:
        """Called once the job is claimed, before its body runs."""

    def after(self, run: Run) -> None:
        """Called once the run ended, whatever its outcome."""
