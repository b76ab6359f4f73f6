"""Which reader an input goes to: its format, told by a folder or by the file's suffix."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from mxq.tasks.inference.inputs.files import InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SUPPORTED = ".npy, .npz, .csv, a folder of images (.png, .jpg, .jpeg), .rec with a sibling .idx"
Format = Literal["npy", "npz", "csv", "images", "rec"]
_BY_SUFFIX: dict[str, Format] = {".npy": "npy", ".npz": "npz", ".csv": "csv", ".rec": "rec"}


def format_of(path: Path) -> Format:
    """The format of `path`: a folder holds images, a file's suffix names the rest."""
    if path.is_dir():
        return "images"
    kind = _BY_SUFFIX.get(path.suffix.lower())
    if kind is None:
        raise InputError(f"input {path} has an unsupported format; supported: {SUPPORTED}")
    return kind
