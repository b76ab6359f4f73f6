"""A folder of images (.png, .jpg, .jpeg): listed once in name order, each file confined to the
folder, decoded a batch at a time (`pixels`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mxq.tasks.inference.inputs.files import InputError, regular_file
from mxq.tasks.inference.inputs.formats import IMAGE_SUFFIXES
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.pixels import ImageShape, decode, to_model
from mxq.tasks.inference.inputs.source import Fetch, Samples


def listed(path: Path) -> list[Path]:
    """The folder's images, each checked where it leads: a symlink out of the (confined) folder
    would read a file outside the data root, a FIFO would block the worker."""
    folder = path.resolve()
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    for p in files:
        if not p.resolve().is_relative_to(folder):
            raise InputError(f"input {p} leads outside its folder {folder} (a symlink to "
                             f"{p.resolve()}): the images of a folder must lie in it")
        regular_file(p)
    return files


def count(path: Path) -> int:
    """The number of images, none of them read."""
    return len(listed(path))


def _batches(files: list[Path], shape: ImageShape, limits: Limits) -> Fetch:
    def fetch(start: int, stop: int) -> NDArray[np.float32]:
        out = []
        for f in files[start:stop]:
            img = decode(regular_file(f).read_bytes(), str(f), shape, limits)
            out.append(to_model(img, shape))
        return np.stack(out)

    return fetch


def opened(path: Path, shape: ImageShape, limits: Limits) -> Samples:
    """Listed (and each file checked) once, for the count and the reads."""
    files = listed(path)
    return Samples(len(files), shape.dims, _batches(files, shape, limits))
