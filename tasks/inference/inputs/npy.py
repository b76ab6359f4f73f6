"""The .npy reader: its header parsed without NumPy's slow path, its data read whole when small
and memory-mapped when large, then read in place a batch at a time, its pages dropped behind."""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import IO, Literal

import numpy as np
from numpy.typing import NDArray

from mxq.tasks.inference.inputs.files import InputError, Location, RemoteObject, open_binary, regular_file
from mxq.tasks.inference.inputs.formats import on_disk
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.source import Fetch, Samples

NUMERIC_KINDS = "biuf"  # bool, int, uint, float
SMALL_NPY_BYTES = 1 << 20  # .npy data up to this size is read whole, larger is memory-mapped
# A mapped .npy is read in place (no copy): its pages are dropped from the worker behind the
# reads, KEEP_MAPPED_BYTES back (the reads of about 4 MiB still in flight: two prefetched, one
# being computed, one being read), DROP_STEP_BYTES at a time (each drop interrupts every core
# running the process to flush its TLB: per 4 MiB read, that cost a small model's job a few per
# cent). A worker holds at most their sum of its input (32 MiB; twice that held a million-sample
# job's worker 80 MiB above its start, tests/faults/test_output_memory.py).
KEEP_MAPPED_BYTES = 16 << 20
DROP_STEP_BYTES = 16 << 20
# The header exactly as NumPy writes it for a plain dtype; any other is read by NumPy's reader.
_NUMPY_HEADER = re.compile(r"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), "
                           r"'shape': \((|\d+,|\d+(?:, \d+)+)\), \} *\n?")

Header = tuple[tuple[int, ...], bool, np.dtype[np.generic]]
"""What an .npy header says: the array's shape, whether it is in Fortran order, its dtype."""

# NumPy's own readers of the magic string and of each header version (untyped in its stubs).
_read_magic: Callable[[IO[bytes]], tuple[int, int]] = np.lib.format.read_magic
_HEADER_READERS: dict[tuple[int, int], Callable[[IO[bytes]], Header]] = {
    (1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def parse_header(f: IO[bytes]) -> Header:
    """Shape, Fortran order and dtype of the .npy header at `f`, left at the data.

    NumPy's reader first re-tokenizes every version 1 header (for files written by Python 2),
    which costs more than reading a small input whole. Here the header NumPy writes is matched
    by one regular expression; any other (old `10L` headers, structured dtypes) goes through
    NumPy's reader.
    """
    start = f.tell()
    version = _read_magic(f)
    if version not in _HEADER_READERS:
        raise ValueError(f"unsupported .npy format version {version}")
    fmt = "<H" if version == (1, 0) else "<I"
    raw = f.read(size := struct.calcsize(fmt))
    if len(raw) != size:
        raise ValueError("the header is cut short")
    length: int = struct.unpack(fmt, raw)[0]
    text = f.read(length).decode("latin1")
    if (m := _NUMPY_HEADER.fullmatch(text)) is not None:
        descr, fortran, dims = m.groups()
        try:
            dtype = np.dtype(descr)
        except TypeError:
            raise ValueError(f"its header names the dtype {descr!r}, which is not a NumPy dtype") from None
        return tuple(int(n) for n in dims.split(",") if n.strip()), fortran == "True", dtype
    f.seek(start)
    return _HEADER_READERS[_read_magic(f)](f)


def read_header(f: IO[bytes], path: Location) -> Header:
    """Shape, Fortran order and dtype from an .npy header, reading no data; rejects
    non-numeric dtypes (an .npz's members are .npy files: `npz` reads them here too)."""
    try:
        shape, fortran, dtype = parse_header(f)
    except (ValueError, TypeError, SyntaxError) as e:  # NumPy's own reader raises all three
        raise InputError(f"input {path} is truncated or corrupt: {e}") from None
    if dtype.kind not in NUMERIC_KINDS:
        raise InputError(f"input {path} has dtype {dtype}; allowed: bool, int, uint or float arrays")
    if not shape:
        raise InputError(f"input {path} holds a scalar, not an array of samples")
    return shape, fortran, dtype


def count(path: Location) -> int:
    """The number of samples, from the header alone."""
    with open_binary(path, headers_only=True) as f:
        return read_header(f, path)[0][0]


def load(path: Path, limits: Limits | None = None) -> NDArray[np.generic]:
    """The .npy array, its header read once: memory-mapped read-only, or read whole when small
    (mapping a file costs more than reading a few pages)."""
    with regular_file(path).open("rb") as f:
        shape, fortran, dtype = read_header(f, path)
        (limits or Limits()).check_bytes(path, "", shape, dtype)
        offset, items = f.tell(), math.prod(shape)
        order: Literal["C", "F"] = "F" if fortran else "C"
        if items * dtype.itemsize <= SMALL_NPY_BYTES:
            array = np.fromfile(f, dtype=dtype, count=items)
            if array.size != items:
                raise InputError(f"input {path} is truncated or corrupt: {array.size} of {items} "
                                 "values present")
            return array.reshape(shape, order=order)
    try:
        return np.memmap(path, dtype=dtype, mode="r", shape=shape, order=order, offset=offset)
    except ValueError as e:
        raise InputError(f"input {path} is truncated or corrupt: {e}") from e


def batches(array: NDArray[np.generic]) -> Fetch:
    """Batches sliced from an array in memory, or read in place from a mapped one, whose pages
    are then dropped from this process behind the reads.

    The mapped file would otherwise stay resident in the worker (RSS growing with the input); the
    dropped pages remain in the OS page cache, so reading them again costs no disk access, and a
    batch still in use when its pages were dropped maps them again (the mapping is read-only and
    file-backed: nothing is lost). A Fortran-ordered array's rows are not contiguous: they are
    copied out, and nothing is dropped.
    """
    if not isinstance(array, np.memmap):
        return lambda start, stop: array[start:stop]
    mapped: mmap.mmap | None = getattr(array, "_mmap", None)
    if mapped is None or not array.ndim or not array.flags.c_contiguous:
        return lambda start, stop: np.array(array[start:stop])
    row, base = array.strides[0], array.offset % mmap.ALLOCATIONGRANULARITY  # data's start in the map
    dropped = 0  # the mapping's bytes before this are dropped

    def fetch(start: int, stop: int) -> NDArray[np.generic]:
        nonlocal dropped
        behind = (base + start * row - KEEP_MAPPED_BYTES) // mmap.PAGESIZE * mmap.PAGESIZE
        if behind - dropped >= DROP_STEP_BYTES:
            mapped.madvise(mmap.MADV_DONTNEED, dropped, behind - dropped)
            dropped = behind
        return np.asarray(array[start:stop])

    return fetch


def ranged(obj: RemoteObject, limits: Limits) -> Samples:
    """An object's samples, each batch read by the ranges it covers (never the object whole):
    the header from one small GET, then forward reads with a bounded read-ahead."""
    with open_binary(obj, headers_only=True) as f:
        shape, fortran, dtype = read_header(f, obj)
        offset = f.tell()
    limits.check_bytes(obj, "", shape, dtype)
    if fortran and len(shape) > 1:
        raise InputError(f"input {obj} is in Fortran order, which cannot be read a batch at a "
                         "time: save it with np.save(np.ascontiguousarray(x))")
    row = math.prod(shape[1:]) * dtype.itemsize
    if offset + shape[0] * row > obj.size:
        raise InputError(f"input {obj} is truncated or corrupt: its header says {shape[0] * row:,} "
                         f"bytes of data, the object holds {obj.size - offset:,}")
    reader = obj.open()

    def fetch(start: int, stop: int) -> NDArray[np.generic]:
        reader.seek(offset + start * row)
        data = bytearray((stop - start) * row)
        if reader.readinto(data) != len(data):
            raise InputError(f"input {obj} is truncated or corrupt: samples [{start}, {stop}) "
                             "are cut short")
        return np.frombuffer(data, dtype=dtype).reshape((stop - start, *shape[1:]))

    return Samples(shape[0], shape[1:], fetch)


def opened(path: Location, limits: Limits) -> Samples:
    if isinstance(path, RemoteObject):
        return ranged(path, limits)
    array = load(on_disk(path), limits)
    return Samples(array.shape[0], array.shape[1:], batches(array))
