"""What an input may decode to, whatever its size on disk: array bytes and image pixels, judged
from headers before anything large is read."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mxq.tasks.inference.image_headers import ImageHeaderError, image_size
from mxq.tasks.inference.inputs.files import InputError, Location
from mxq.workers.settings import DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_INPUT_BYTES, Settings


@dataclass(frozen=True)
class Limits:
    """What an input may decode to, whatever its size on disk (an .npz of 995 KB can hold
    1 GiB, a PNG of 875 KB 900 MB of pixels): array bytes and image pixels."""

    max_bytes: int = DEFAULT_MAX_INPUT_BYTES  # MXQ_MAX_INPUT_BYTES
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # MXQ_MAX_IMAGE_PIXELS

    @classmethod
    def of(cls, s: Settings) -> Limits:
        """The limits a worker's settings set (a job passes its own: `JobContext.settings`)."""
        return cls(s.max_input_bytes, s.max_image_pixels)

    def check_bytes(self, path: Location, what: str, shape: tuple[int, ...],
                    dtype: np.dtype[np.generic]) -> None:
        size = math.prod(shape) * dtype.itemsize
        if size > self.max_bytes:
            raise InputError(f"input {path} {what}holds {size:,} bytes of {dtype} {shape} when read, "
                             f"more than the {self.max_bytes:,} allowed (MXQ_MAX_INPUT_BYTES)")

    def check_image(self, where: str, data: bytes) -> None:
        """A whole PNG or JPEG of at most max_pixels, judged from its header before decoding."""
        try:
            width, height = image_size(data)
        except ImageHeaderError as e:
            raise InputError(f"input {where} is not a whole PNG or JPEG image: it is {e}") from None
        if not width or not height:
            raise InputError(f"input {where} is {width}x{height} pixels")
        if width * height > self.max_pixels:
            raise InputError(f"input {where} is {width}x{height} pixels ({width * height:,}), more than "
                             f"the {self.max_pixels:,} allowed (MXQ_MAX_IMAGE_PIXELS)")
