"""A folder of images (.png, .jpg, .jpeg): listed once in name order, each file confined to the
folder, decoded a batch at a time (`pixels`); or the images directly under a bucket prefix,
a batch's objects fetched side by side (one GET each costs a round trip)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mxq.tasks.inference.inputs.files import InputError, RemotePrefix, regular_file
from mxq.tasks.inference.inputs.formats import IMAGE_SUFFIXES
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.pixels import ImageShape, decode, to_model
from mxq.tasks.inference.inputs.source import Fetch, Samples

FETCHES_AT_ONCE = 16  # images of a bucket prefix fetched side by side


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


def count(path: Path | RemotePrefix) -> int:
    """The number of images, none of them read."""
    return len(_remote_images(path)) if isinstance(path, RemotePrefix) else len(listed(path))


def _remote_images(prefix: RemotePrefix) -> list[tuple[str, int]]:
    return [(key, size) for key, size in prefix.objects if Path(key).suffix.lower() in IMAGE_SUFFIXES]


def _remote_batches(prefix: RemotePrefix, shape: ImageShape, limits: Limits) -> Fetch:
    images = _remote_images(prefix)
    pool = ThreadPoolExecutor(max_workers=FETCHES_AT_ONCE, thread_name_prefix="mxq-s3-images")

    def one(item: tuple[str, int]) -> NDArray[np.float32]:
        key, size = item
        where = f"s3://{prefix.url.bucket}/{key}"
        return to_model(decode(prefix.read(key, size), where, shape, limits), shape)

    def fetch(start: int, stop: int) -> NDArray[np.float32]:
        return np.stack(list(pool.map(one, images[start:stop])))

    return fetch


def _batches(files: list[Path], shape: ImageShape, limits: Limits) -> Fetch:
    def fetch(start: int, stop: int) -> NDArray[np.float32]:
        out = []
        for f in files[start:stop]:
            img = decode(regular_file(f).read_bytes(), str(f), shape, limits)
            out.append(to_model(img, shape))
        return np.stack(out)

    return fetch


def opened(path: Path | RemotePrefix, shape: ImageShape, limits: Limits) -> Samples:
    """Listed (and each file checked) once, for the count and the reads."""
    if isinstance(path, RemotePrefix):
        return Samples(count(path), shape.dims, _remote_batches(path, shape, limits))
    files = listed(path)
    return Samples(len(files), shape.dims, _batches(files, shape, limits))
