"""Images written without an image library: cv2 is not installed, so MXNet's `pack_img` and
`unpack_img` cannot make them, while MXNet's own decoder (`imread`, `imdecode`) reads them."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
from numpy.typing import NDArray


def png_bytes(pixels: NDArray[Any]) -> bytes:
    """Minimal 8-bit PNG: (H, W) grey or (H, W, 3) RGB, unfiltered rows, one IDAT."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    h, w = pixels.shape[:2]
    colour_type = 0 if pixels.ndim == 2 else 2
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", w, h, 8, colour_type, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def solid(rgb: tuple[int, int, int], h: int = 4, w: int = 6) -> NDArray[np.uint8]:
    """An (h, w) RGB image of one colour."""
    return np.broadcast_to(np.array(rgb, dtype=np.uint8), (h, w, 3))
