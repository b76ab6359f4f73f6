"""An opened input: what a format's reader found (`Samples`), and the `InputSource` inference
reads batches from, as float32 scaled by the model's preprocessing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from mxq.preprocess import Preprocess
from mxq.tasks.inference.inputs.files import InputError, Location

FLOAT32_MAX = float(np.finfo(np.float32).max)

Fetch = Callable[[int, int], NDArray[np.generic]]
"""Samples [start, stop) of an input as its format holds them (any numeric dtype)."""


@dataclass(frozen=True)
class Samples:
    """What a format's reader found: how many samples, the shape of one as stored, and how to
    fetch a batch of them (only that batch is read)."""

    count: int
    shape: tuple[int, ...]
    fetch: Fetch


@dataclass
class InputSource:
    path: Location  # a local path, or an object of the store
    count: int  # number of samples
    sample_shape: tuple[int, ...]  # shape of one sample as the model sees it
    fetch: Fetch = field(repr=False)  # raw samples [start, stop)
    preprocess: Preprocess = field(default_factory=Preprocess)  # the model's input scaling
    model: str = "the model"  # whose preprocessing it applies (`name:version`), for errors

    def read(self, start: int, stop: int) -> NDArray[np.float32]:
        """Samples [start, stop) as the model takes them: float32 (stop-start, *sample_shape),
        scaled by its preprocessing; only that batch is read."""
        if not 0 <= start <= stop <= self.count:
            raise IndexError(f"samples [{start}, {stop}) out of range for {self.count} in {self.path}")
        raw = np.asarray(self.fetch(start, stop))
        if raw.dtype.kind == "f" and raw.dtype.itemsize > 4:
            self._check_float32_range(raw, start)
        batch = raw.astype(np.float32, copy=False)
        return self.preprocess.apply(batch.reshape((stop - start, *self.sample_shape)))

    def overflow(self, index: int, found: str) -> str | None:
        """Why sample `index` read as `found` (NaN or an infinity) when it is finite as stored:
        the version's preprocessing made it so, and that, not the input, is what to fix. None
        when the sample itself is not finite (fetched again: only a failing read asks)."""
        if self.preprocess.identity or not np.isfinite(np.asarray(self.fetch(index, index + 1))).all():
            return None
        return (f"model {self.model}'s preprocessing ({self.preprocess.describe()}) turns sample "
                f"{index} of input {self.path} into {found}; the sample itself is finite (register "
                "the version again with a --scale, --mean or --std that keeps it finite in float32)")

    def _check_float32_range(self, raw: NDArray[np.generic], start: int) -> None:
        """A finite float64 beyond float32's range would become inf without a word."""
        over = np.isfinite(raw) & (np.abs(raw) > FLOAT32_MAX)
        if over.any():
            at = tuple(np.argwhere(over)[0])  # the first one, in sample order
            sample, value = int(at[0]), raw[at]
            raise InputError(f"input {self.path} has {value:g} in sample {start + sample}, beyond "
                             f"float32's range (±{FLOAT32_MAX:.4g}), which models compute in")
