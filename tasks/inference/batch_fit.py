"""The batch size that fits the device: a batch that runs out of memory is split, the size
halved (down to MIN_BATCH_SIZE) and kept for the rest of the job; each halving is recorded as
a job event, with whether the smaller size worked. Each batch's forward pass runs under the job's
device watch (`JobContext.watch`): one that never returns takes its device out as hung."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mxq.db import events
from mxq.tasks.inference import engines
from mxq.tasks.job_context import JobContext
from mxq.tasks.runtimes.oom import OutOfMemory, is_out_of_memory

MIN_BATCH_SIZE = 1  # the floor: a batch that runs out of memory at this size fails the job


@dataclass
class BatchFit:
    """The batch size that fits the device: halved on out-of-memory, down to MIN_BATCH_SIZE."""

    job: JobContext
    requested: int
    size: int = 0
    halved: tuple[int, int] | None = None  # (size that ran out, size tried next), not yet settled
    batch_seconds: float | None = None  # what the last batch of `size` took

    def __post_init__(self) -> None:
        self.size = self.size or self.requested

    def predict(self, engine: engines.Engine, x: NDArray[np.float32]) -> NDArray[np.float32]:
        """Probabilities of all of `x`, computed in slices of the current size, in order."""
        parts: list[NDArray[np.float32]] = []
        i = 0
        while i < len(x):
            n = min(self.size, len(x) - i)
            try:
                began = time.perf_counter()
                with self.job.watch.batch():  # the heartbeat takes a device hung in it out
                    probs = engine.forward(x[i:i + n])
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                engine.release()
                self._halve(n)
                continue  # the same samples again, in smaller slices
            self._settle(worked=True)
            if n == self.size:
                self.batch_seconds = time.perf_counter() - began
            parts.append(probs)
            i += n
        probs = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if (bad := engines.first_non_finite(probs)) is not None:  # once for the whole read
            raise engines.NonFiniteOutput(*bad)
        return probs

    def _halve(self, n: int) -> None:
        self._settle(worked=False)
        if n <= MIN_BATCH_SIZE:
            raise OutOfMemory(f"out of memory at batch size {n} on {self.job.device} (started at "
                              f"{self.requested}; the floor is {MIN_BATCH_SIZE})") from None
        self.size = max(MIN_BATCH_SIZE, n // 2)
        self.halved = (n, self.size)

    def _settle(self, worked: bool) -> None:
        """Record the pending halving with its outcome."""
        if self.halved is None:
            return
        failed, size = self.halved
        self.halved = None
        outcome = "it worked" if worked else "out of memory again"
        events.record(self.job.url, self.job.id, events.OOM,
                      f"out of memory at batch size {failed} on {self.job.device}; halved to "
                      f"{size}: {outcome}", batch_size=size, failed_batch_size=failed,
                      worked=worked, device=self.job.device)
