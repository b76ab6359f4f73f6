"""MXNet RecordIO: a .rec of images with its .idx beside it. The index is read as text for the
count (no MXNet); records are opened per batch and decoded as images (`pixels`)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mxq.errors import reason
from mxq.tasks.inference.inputs.files import InputError, regular_file
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.pixels import ImageShape, decode, to_model
from mxq.tasks.inference.inputs.source import Fetch, Samples


def index_of(path: Path) -> Path:
    """The .idx beside the .rec, a regular file in the same folder."""
    idx = path.with_suffix(".idx")
    if not idx.exists():
        raise InputError(f"input {path} has no index {idx.name} beside it (RecordIO needs .rec + .idx)")
    if not idx.resolve().is_relative_to(path.resolve().parent):
        raise InputError(f"input {path} has an index {idx.name} that leads outside its folder")
    return regular_file(idx, "the index of input")


def keys(path: Path, idx: Path) -> list[int]:
    """The record keys a RecordIO index lists (`key<TAB>offset` per line), or one error naming the
    line that is not one (MXNet's own reader answers a traceback)."""
    found = []
    with idx.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2 or not all(p.isdecimal() for p in parts):
                raise InputError(f"input {path} has an index {idx.name} whose line {n} is not "
                                 f"'key<TAB>offset': {line.strip()[:60]!r}")
            found.append(int(parts[0]))
    return found


def count(path: Path) -> int:
    """The number of records its index lists."""
    return len(keys(path, index_of(path)))


def _batches(path: Path, idx: Path, shape: ImageShape, limits: Limits) -> Fetch:
    """Records are opened per batch: no handle outlives a read, so the source survives forks."""

    def fetch(start: int, stop: int) -> NDArray[np.float32]:
        from mxq.tasks.runtimes.mx import mx

        try:
            rec = mx.recordio.MXIndexedRecordIO(str(idx), str(path), "r")
        except (mx.base.MXNetError, ValueError, IndexError) as e:
            raise InputError(f"input {path} is not a RecordIO file MXNet can open with its index "
                             f"{idx.name}: {reason(e)}") from None
        try:
            out = []
            for key in rec.keys[start:stop]:
                try:
                    _header, payload = mx.recordio.unpack(rec.read_idx(key))
                except (mx.base.MXNetError, struct.error, ValueError) as e:
                    raise InputError(f"input {path} record {key} cannot be read at the offset its "
                                     f"index gives: {reason(e)}") from None
                # imdecode, MXNet's own decoder (RGB, like imread); unpack_img would need cv2
                out.append(to_model(decode(payload, f"{path} record {key}", shape, limits), shape))
            return np.stack(out)
        finally:
            rec.close()

    return fetch


def opened(path: Path, shape: ImageShape, limits: Limits) -> Samples:
    idx = index_of(path)
    return Samples(len(keys(path, idx)), shape.dims, _batches(path, idx, shape, limits))
