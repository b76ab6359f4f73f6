"""A device worker's start check, bounded in time, and the refusal that ends a worker whose device
fails it.

Before a worker takes work it checks its device (`tasks.runtimes.mx_context.check_visible`: a
small matmul; the ONNX worker's `onnx_check`; NVML's sticky errors). A hung GPU never answers
such a call, and the thread in it cannot be interrupted: the check runs in a thread of its own,
and one that has not finished within MXQ_START_CHECK_SECONDS is a failed check. The worker then
refuses its device as for any failed check (`refuse`: the reason printed where the launcher reads
it, exit REFUSED_EXIT), so the device stays out with that reason and is probed again later.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from mxq.errors import typed_line
from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT

log = logging.getLogger(__name__)


def within(seconds: float, check: Callable[[], str | None], device: str) -> str | None:
    """What `check` says is wrong with `device` (None: nothing), or that it did not finish in
    `seconds`: the device taken for hung. A check that raises fails with its error."""
    said: list[str | None] = []

    def run() -> None:
        try:
            said.append(check())
        except Exception as exc:  # a check is written to answer; one that raises still fails
            said.append(f"worker for {device}: its start check failed ({typed_line(exc)})")

    thread = threading.Thread(target=run, name="mxq-start-check", daemon=True)
    thread.start()
    thread.join(seconds)
    if not said:
        return (f"worker for {device}: its start check did not finish in {seconds:g} s "
                "(MXQ_START_CHECK_SECONDS): the device is taken for hung")
    return said[0]


def check_or_refuse(seconds: float, check: Callable[[], str | None], device: str) -> None:
    """A worker's start check (`within`); the worker ends (`refuse`) where it fails."""
    if problem := within(seconds, check, device):
        refuse(problem)


def refuse(problem: str) -> NoReturn:
    """End this worker before it consumes anything: its device is unusable for `problem`, which
    the launcher reads from its output (`mxq devices` shows it); it is probed again later."""
    log.error("refusing to start: %s", problem)
    print(f"{REFUSAL_PREFIX}{problem}", file=sys.stderr, flush=True)
    os._exit(REFUSED_EXIT)
