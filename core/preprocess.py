"""How a model expects its input scaled: `(x * scale - mean) / std`, per channel, in a layout.

Stored on each model version (`mxq models add --scale 1/255 --mean R,G,B --std R,G,B
--layout NCHW|NHWC`; a training registers what it trained with) and applied by the worker to
every input kind before the model sees it. With none given a version keeps the identity: inputs
reach the model as they are stored (images as decoded, 0..255).

The arithmetic runs in float32, so the values must keep every input finite there: for inputs of
magnitude up to INPUT_BOUND (images are 0..255; float inputs are what the user has), `scale` lies
in [FLOAT32_TINY, FLOAT32_MAX / (2 * INPUT_BOUND)], each `|mean|` is at most FLOAT32_MAX / 2, and
each `std` at least FLOAT32_TINY and at least (INPUT_BOUND * scale + max |mean|) / FLOAT32_MAX, so
`|(x * scale - mean) / std|` stays below FLOAT32_MAX (each bound keeps 0.1 % headroom for
rounding). A zero or subnormal scale or std (which float32 flushes to zero or to a few bits) is
refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

from mxq.errors import UserError

if TYPE_CHECKING:  # NumPy is imported by `apply`: the registry reads rules, the CLI starts fast
    import numpy as np
    from numpy.typing import NDArray

LAYOUTS = ("NCHW", "NHWC")
INPUT_BOUND = 1e6  # the largest input magnitude preprocessing must keep finite in float32
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
_TOP = FLOAT32_MAX * 0.999  # the bounds' ceiling: headroom for float32's rounding of each step
Layout = Literal["NCHW", "NHWC"]


class PreprocessError(UserError):
    """A --scale, --mean, --std or --layout that cannot describe the model's input."""


def parse_scale(text: str) -> float:
    """A positive finite number, written as one (0.00392) or as a fraction (1/255)."""
    try:
        value = float(Fraction(text.replace(" ", ""))) if "/" in text else float(text)
    except (ValueError, ZeroDivisionError, OverflowError):  # OverflowError: 1/3 with 400 digits
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise PreprocessError(f"--scale {text!r}: expected a positive number or fraction such as "
                              "1/255 or 0.5")
    return value


def parse_channels(option: str, text: str, positive: bool = False) -> tuple[float, ...]:
    """Comma-separated finite numbers (one, or one per channel)."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = (math.nan,)
    if not values or not all(math.isfinite(v) and (v > 0 or not positive) for v in values):
        kind = "positive numbers" if positive else "numbers"
        raise PreprocessError(f"{option} {text!r}: expected {kind} separated by commas, one or one "
                              "per channel, such as 0.485,0.456,0.406")
    return values


@dataclass(frozen=True)
class Preprocess:
    scale: float = 1.0
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    layout: Layout = "NCHW"

    @classmethod
    def parse(cls, scale: str | None = None, mean: str | None = None, std: str | None = None,
              layout: str | None = None) -> Preprocess:
        """From the options of `mxq models add` (`check` then holds it against the model)."""
        if layout is not None and layout.upper() not in LAYOUTS:
            raise PreprocessError(f"--layout {layout!r}: expected NCHW or NHWC")
        spec = cls(scale=1.0 if scale is None else parse_scale(scale),
                   mean=None if mean is None else parse_channels("--mean", mean),
                   std=None if std is None else parse_channels("--std", std, positive=True),
                   layout="NHWC" if layout is not None and layout.upper() == "NHWC" else "NCHW")
        spec.check_range()
        return spec

    def check_range(self) -> None:
        """Refuse values whose float32 arithmetic turns an input of magnitude up to INPUT_BOUND
        into zero, a subnormal or an infinity (then every prediction is the same garbage),
        naming the value and the bound."""
        why = f"inputs up to {INPUT_BOUND:g} in magnitude must stay finite in float32"
        high = _TOP / (2 * INPUT_BOUND)
        if not FLOAT32_TINY <= self.scale <= high:
            raise PreprocessError(f"--scale {self.scale:g}: allowed {FLOAT32_TINY:.4g} to {high:.4g} "
                                  f"({why})")
        mean = max((abs(v) for v in self.mean or ()), default=0.0)
        if mean > _TOP / 2:
            raise PreprocessError(f"--mean {mean:g}: allowed magnitudes up to {_TOP / 2:.4g} ({why})")
        low = max(FLOAT32_TINY, (INPUT_BOUND * self.scale + mean) / _TOP)
        for v in self.std or ():
            if not low <= v <= FLOAT32_MAX:
                raise PreprocessError(f"--std {v:g}: allowed {low:.4g} to {FLOAT32_MAX:.4g} with "
                                      f"--scale {self.scale:g} and largest |mean| {mean:g} ({why})")

    def channels(self, input_shape: tuple[int, ...]) -> int:
        """The size of the channel axis of one sample in this layout."""
        return input_shape[-1] if self.layout == "NHWC" else input_shape[0]

    def check(self, input_shape: tuple[int, ...]) -> None:
        """Refuse a layout or a channel count the model's one-sample shape does not have, or
        values outside float32's range (`check_range`)."""
        self.check_range()
        if self.layout == "NHWC" and len(input_shape) != 3:
            raise PreprocessError(f"--layout NHWC needs an input shape (H, W, C), not {input_shape}")
        width = self.channels(input_shape)
        for option, values in (("--mean", self.mean), ("--std", self.std)):
            if values is not None and len(values) not in (1, width):
                allowed = "1 value" if width == 1 else f"1 or {width} values"
                raise PreprocessError(f"{option} has {len(values)} values; the input {input_shape} "
                                      f"({self.layout}) has {width} channel(s): give {allowed}")

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.mean is None and self.std is None

    def describe(self) -> str:
        """In one short line, as `mxq models` shows it: `x*0.00392 -0.5 /0.25 NCHW`, or `none`."""
        if self.identity:
            return "none"
        parts = [f"x*{self.scale:.6g}"]
        parts += [f"-{','.join(f'{v:g}' for v in self.mean)}"] if self.mean else []
        parts += [f"/{','.join(f'{v:g}' for v in self.std)}"] if self.std else []
        return " ".join([*parts, self.layout])

    def as_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "mean": None if self.mean is None else list(self.mean),
                "std": None if self.std is None else list(self.std), "layout": self.layout}

    @classmethod
    def from_dict(cls, stored: dict[str, Any] | None) -> Preprocess:
        """What a version stores (None: a version from before preprocessing was stored)."""
        if not stored:
            return cls()
        mean, std = stored.get("mean"), stored.get("std")
        return cls(scale=float(stored.get("scale", 1.0)),
                   mean=None if mean is None else tuple(float(v) for v in mean),
                   std=None if std is None else tuple(float(v) for v in std),
                   layout="NHWC" if stored.get("layout") == "NHWC" else "NCHW")

    def _per_channel(self, values: tuple[float, ...], ndim: int) -> NDArray[np.float32]:
        """`values` shaped to broadcast over a batch of `ndim` dimensions on the channel axis."""
        import numpy as np

        array = np.asarray(values, dtype=np.float32)
        if len(values) == 1:
            return array.reshape(())
        shape = [1] * ndim
        shape[-1 if self.layout == "NHWC" else 1] = len(values)
        return array.reshape(shape)

    def apply(self, batch: NDArray[np.generic]) -> NDArray[np.float32]:
        """A batch (N, *sample_shape) as the model expects it, in float32."""
        import numpy as np

        x = np.asarray(batch, dtype=np.float32)
        if self.identity:
            return x
        with np.errstate(over="ignore"):  # an input beyond INPUT_BOUND: its reader names the inf
            x = x * np.float32(self.scale)
            if self.mean is not None:
                x -= self._per_channel(self.mean, x.ndim)
            if self.std is not None:
                x /= self._per_channel(self.std, x.ndim)
        return x
