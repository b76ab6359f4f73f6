"""What an inference job's time goes to besides its batches: its fixed costs, reported with its
result as `fixed_costs` so that a short job's rate can be read against them (bench: engines).

From the claim: the engine made ready (`model_load`: the model loaded, or found in the worker's
cache), for `--engine auto` or `--precision auto` the engines or variants measured the first
time on this kind of device (`engine_measure`, the other engines' loads included), a variant's
check on the input's first samples (`variant_check`), the first outputs in hand
(`claim_to_first_batch`, which holds the three before it), and after the last batch the wait for
its flush and the output's verification (`last_flush`). Seconds, rounded to 0.1 ms; null where
the job computed nothing. Each job's frame holds one (`JobContext.costs`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class FixedCosts:
    """A job's stopwatch: `claimed` is when its attempt's claim succeeded (perf_counter)."""

    claimed: float
    model_load: float = 0.0
    engine_measure: float = 0.0  # added to by each measuring (tasks.inference.engines)
    variant_check: float = 0.0
    first_batch_at: float | None = None  # when the job's first outputs were in hand
    last_batch_at: float | None = None  # when its last batch was computed
    finished_at: float | None = None  # when its outputs were stored and verified

    def engine_ready(self, since: float, check_seconds: float) -> None:
        """The engine took from `since` until now, `check_seconds` of it its variant's check and
        `engine_measure` its measuring."""
        self.variant_check = check_seconds
        self.model_load = max(0.0, time.perf_counter() - since - check_seconds - self.engine_measure)

    def outputs_added(self) -> None:
        """A batch's outputs are in hand: the first one ends the job's start."""
        self.last_batch_at = time.perf_counter()
        if self.first_batch_at is None:
            self.first_batch_at = self.last_batch_at

    def finished(self) -> None:
        self.finished_at = time.perf_counter()

    def reported(self) -> dict[str, float | None]:
        """The result's `fixed_costs`."""
        def since(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else round(end - start, 4)

        return {"claim_to_first_batch": since(self.claimed, self.first_batch_at),
                "model_load": round(self.model_load, 4), "engine_measure": round(self.engine_measure, 4),
                "variant_check": round(self.variant_check, 4),
                "last_flush": since(self.last_batch_at, self.finished_at)}
