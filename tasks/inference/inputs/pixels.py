"""An image as a model takes it: the model's input shape checked for one, the image's header
checked against the limits, then decoded by MXNet (imported only here, when an image is read)
and resized to the model's size with its channels where the model wants them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mxq.errors import reason
from mxq.tasks.inference.inputs.files import InputError
from mxq.tasks.inference.inputs.limits import Limits


def check_channels(path: object, input_shape: tuple[int, ...], layout: str = "NCHW") -> None:
    """A model fed images takes (C, H, W), or (H, W, C) in NHWC, with 1 or 3 channels."""
    channels = input_shape[-1] if layout == "NHWC" else input_shape[0] if input_shape else 0
    if len(input_shape) != 3 or channels not in (1, 3):
        form = "(H, W, C)" if layout == "NHWC" else "(C, H, W)"
        raise InputError(f"input {path} holds images, so the model input must be {form} with C 1 "
                         f"or 3, not {input_shape}")


@dataclass(frozen=True)
class ImageShape:
    """Where the model wants an image's channels (NCHW: first, NHWC: last) and its size."""

    channels: int
    height: int
    width: int
    last: bool  # NHWC

    @classmethod
    def of(cls, shape: tuple[int, ...], layout: str) -> ImageShape:
        if layout == "NHWC":
            return cls(shape[2], shape[0], shape[1], True)
        return cls(shape[0], shape[1], shape[2], False)

    @property
    def dims(self) -> tuple[int, int, int]:
        """One image's shape as the model takes it."""
        if self.last:
            return self.height, self.width, self.channels
        return self.channels, self.height, self.width

    @property
    def flag(self) -> int:
        """MXNet's decode flag: 0 grey, 1 colour."""
        return 0 if self.channels == 1 else 1


def to_model(img: Any, shape: ImageShape) -> NDArray[np.float32]:
    """HWC mx NDArray -> float32 at the model's (H, W) in its layout, values 0..255 as decoded."""
    from mxq.tasks.runtimes.mx import mx

    if img.shape[:2] != (shape.height, shape.width):
        img = mx.image.imresize(img, shape.width, shape.height)
    pixels: NDArray[np.float32] = img.asnumpy().astype(np.float32)
    return pixels if shape.last else pixels.transpose(2, 0, 1)


def decode(data: bytes, where: str, shape: ImageShape, limits: Limits) -> Any:
    """One image (an mx NDArray, HWC), its header checked first (format, whole, pixels), then
    decoded by MXNet."""
    from mxq.tasks.runtimes.mx import mx

    limits.check_image(where, data)
    try:
        return mx.image.imdecode(data, flag=shape.flag)
    except mx.base.MXNetError as e:
        raise InputError(f"input {where} is not a decodable image: {reason(e)}") from None
