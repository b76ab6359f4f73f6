"""What an image file says about itself before anyone decodes it: its format, width and height,
and whether it ends as its format ends.

A decoder handed a 30000x30000 PNG of 875 KB allocates about 900 MB; one handed a PNG cut to
40 bytes returns zeros, and one handed an empty file fails with a raw OpenCV assertion. Reading
the header first lets a job fail with one line naming the file and what was found.
"""

from __future__ import annotations

import struct

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8"
# JPEG start-of-frame markers (their segment holds height and width); C4, C8 and CC are not frames.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_TAIL = 1024  # a JPEG's end-of-image marker is looked for this far from the end


class ImageHeaderError(ValueError):
    """The bytes are not a whole PNG or JPEG image; the message says what was found."""


def _png_size(data: bytes) -> tuple[int, int]:
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ImageHeaderError(f"a PNG cut short in its header ({len(data)} bytes)")
    width, height = struct.unpack(">II", data[16:24])
    if b"IEND" not in data[-12:]:
        raise ImageHeaderError(f"a PNG cut short: no IEND chunk at its end ({len(data)} bytes)")
    return width, height


def _jpeg_size(data: bytes) -> tuple[int, int]:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            raise ImageHeaderError(f"a JPEG with a broken marker at byte {at}")
        marker = data[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            at += 1 if marker == 0xFF else 2  # fill bytes and markers without a length
            continue
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            if b"\xff\xd9" not in data[-_TAIL:]:
                raise ImageHeaderError(f"a JPEG cut short: no end-of-image marker ({len(data)} bytes)")
            return width, height
        at += 2 + length
    raise ImageHeaderError(f"a JPEG with no frame header ({len(data)} bytes)")


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a whole PNG or JPEG, or ImageHeaderError saying what the bytes are."""
    if not data:
        raise ImageHeaderError("an empty file (0 bytes)")
    if data.startswith(PNG_MAGIC):
        return _png_size(data)
    if data.startswith(JPEG_MAGIC):
        return _jpeg_size(data)
    raise ImageHeaderError(f"neither PNG nor JPEG (it starts with {data[:8]!r})")
