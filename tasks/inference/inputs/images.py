"""A folder of images (.png, .jpg, .jpeg): listed once in name order, each file confined to the
folder, decoded a batch at a time (`pixels`); or the images directly under a bucket prefix,
a batch's objects fetched side by side (one GET each costs a round trip). Each image read is the
version listed (a file's size, mtime and inode; an object's ETag): one changed since fails the
read, naming it, so no output mixes two versions of a folder."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mxq.tasks.inference.inputs.files import InputError, RemotePrefix, regular_file
from mxq.tasks.inference.inputs.formats import IMAGE_SUFFIXES
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.pixels import ImageShape, decode, to_model
from mxq.tasks.inference.inputs.source import Fetch, Samples
from mxq.workers.storage.locate import stamp

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
    return len(path.images) if isinstance(path, RemotePrefix) else len(listed(path))


def _remote_batches(prefix: RemotePrefix, shape: ImageShape, limits: Limits) -> Fetch:
    images = prefix.images
    pool = ThreadPoolExecutor(max_workers=FETCHES_AT_ONCE, thread_name_prefix="mxq-s3-images")

    def one(item: tuple[str, int, str]) -> NDArray[np.float32]:
        key, size, etag = item
        where = f"s3://{prefix.url.bucket}/{key}"
        return to_model(decode(prefix.read(key, size, etag), where, shape, limits), shape)

    def fetch(start: int, stop: int) -> NDArray[np.float32]:
        return np.stack(list(pool.map(one, images[start:stop])))

    return fetch


def _read(path: Path, as_listed: str) -> bytes:
    """The file's bytes, if they are the version listed: its size, mtime and inode as it was
    read (the open file's, so a replacement or a rewrite before or during the read shows)."""
    with regular_file(path).open("rb") as f:
        data = f.read()
        now = stamp(os.fstat(f.fileno()))
    if now != as_listed:
        raise InputError(f"input {path} changed since the job listed its folder (then: {as_listed}; "
                         f"now: {now}): submit the job again to score the new contents")
    return data


def _batches(files: list[tuple[Path, str]], shape: ImageShape, limits: Limits) -> Fetch:
    def fetch(start: int, stop: int) -> NDArray[np.float32]:
        out = []
        for f, as_listed in files[start:stop]:
            img = decode(_read(f, as_listed), str(f), shape, limits)
            out.append(to_model(img, shape))
        return np.stack(out)

    return fetch


def opened(path: Path | RemotePrefix, shape: ImageShape, limits: Limits) -> Samples:
    """Listed (and each file checked, its version kept) once, for the count and the reads."""
    if isinstance(path, RemotePrefix):
        return Samples(count(path), shape.dims, _remote_batches(path, shape, limits))
    files = [(f, stamp(f.stat())) for f in listed(path)]
    return Samples(len(files), shape.dims, _batches(files, shape, limits))
