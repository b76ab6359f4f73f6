"""The probe: an environment check of one device, its parameters bounded by a FLOP budget."""

from __future__ import annotations

from typing import ClassVar

from pydantic import ConfigDict, Field, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from mxq.status import JobKind
from mxq.workers.jobs.kinds.params import TimeLimited
from mxq.workers.settings import get_settings

# The probe's convolution: a batch of RGB 64x64 images through 16 3x3 filters, padded to size.
CONV_SHAPE = (3, 64, 64)
CONV_FILTERS, CONV_KERNEL = 16, 3


def probe_flops(size: int, batch: int, repeat: int) -> int:
    """The work a probe does: `repeat` timed rounds plus one warm-up of a size x size matrix
    multiply and of the batch's convolution (multiply-adds counted as two)."""
    conv = 2 * batch * CONV_FILTERS * CONV_SHAPE[1] * CONV_SHAPE[2] * CONV_SHAPE[0] * CONV_KERNEL**2
    return (repeat + 1) * (2 * size**3 + conv)


class ProbeParams(TimeLimited):
    """An environment check: matrix multiply and convolution throughput on one device.

    Its work is bounded by MXQ_MAX_PROBE_GFLOP, so one probe holds a device for seconds: the
    fields' own bounds alone allowed size 16384 x repeat 10000, minutes on a big GPU."""

    model_config = ConfigDict(extra="forbid")
    job_kind: ClassVar[JobKind] = JobKind.PROBE

    size: int = Field(1024, ge=16, le=16384, description="Matrix side for the multiply.")
    batch: int = Field(32, ge=1, le=4096, description="Images per convolution batch.")
    repeat: int = Field(5, ge=1, le=10000, description="Timed rounds of each benchmark.")

    @model_validator(mode="after")
    def _within_budget(self, info: ValidationInfo) -> ProbeParams:
        limit = (info.context or {}).get("max_probe_gflop") or get_settings().limits.max_probe_gflop
        gflop = probe_flops(self.size, self.batch, self.repeat) / 1e9
        if gflop > limit:
            raise PydanticCustomError(
                "probe_budget", "size={size}, batch={batch}, repeat={repeat} is {gflop} GFLOP of "
                "work; at most {limit} GFLOP (MXQ_MAX_PROBE_GFLOP): lower size or repeat",
                {"size": self.size, "batch": self.batch, "repeat": self.repeat,
                 "gflop": f"{gflop:,.0f}", "limit": limit})
        return self

