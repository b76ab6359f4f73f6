"""Input readers for bulk inference: .npy, .npz, .csv, a folder of images, MXNet RecordIO.

Every reader counts its samples cheaply up front and reads them a batch at a time, so a large
.npy file is memory-mapped and never loaded whole. mxnet is imported only in the image and
RecordIO paths: the CLI process validates inputs with `inside_root` and `count_samples` and must
stay light.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mxq.errors import UserError
from mxq.preprocess import Preprocess

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SUPPORTED = ".npy, .npz, .csv, a folder of images (.png, .jpg, .jpeg), .rec with a sibling .idx"
NUMERIC_KINDS = "biuf"  # bool, int, uint, float
SMALL_NPY_BYTES = 1 << 20  # .npy data up to this size is read whole, larger is memory-mapped
# Dropped with each batch, before its start: the kernel maps cached pages around a page fault
# ("fault-around", 64 KiB by default), so reading a batch maps again a few pages of the last one.
DROP_BEHIND_BYTES = 1 << 20
# The header exactly as NumPy writes it for a plain dtype; any other is read by NumPy's reader.
_NUMPY_HEADER = re.compile(r"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), "
                           r"'shape': \((|\d+,|\d+(?:, \d+)+)\), \} *\n?")
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class InputError(UserError):
    """Bad input; the message names the file and the problem."""


def _kind(path: Path) -> str:
    """The format of `path`, chosen by folder or suffix."""
    if path.is_dir():
        return "images"
    kind = {".npy": "npy", ".npz": "npz", ".csv": "csv", ".rec": "rec"}.get(path.suffix.lower())
    if kind is None:
        raise InputError(f"input {path} has an unsupported format; supported: {SUPPORTED}")
    return kind


def _parse_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype of the .npy header at `f`, left at the data.

    NumPy's reader first re-tokenizes every version 1 header (for files written by Python 2),
    which costs more than reading a small input whole. Here the header NumPy writes is matched
    by one regular expression; any other (old `10L` headers, structured dtypes) goes through
    NumPy's reader.
    """
    start = f.tell()
    version = np.lib.format.read_magic(f)
    if version not in _HEADER_READERS:
        raise ValueError(f"unsupported .npy format version {version}")
    fmt = "<H" if version == (1, 0) else "<I"
    raw = f.read(size := struct.calcsize(fmt))
    if len(raw) != size:
        raise ValueError("the header is cut short")
    text = f.read(struct.unpack(fmt, raw)[0]).decode("latin1")
    if (m := _NUMPY_HEADER.fullmatch(text)) is not None:
        descr, fortran, dims = m.groups()
        return tuple(int(n) for n in dims.split(",") if n.strip()), fortran == "True", np.dtype(descr)
    f.seek(start)
    return _HEADER_READERS[np.lib.format.read_magic(f)](f)


def _read_header(f: Any, path: Path) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from an .npy header, reading no data; rejects
    non-numeric dtypes."""
    try:
        shape, fortran, dtype = _parse_header(f)
    except ValueError as e:
        raise InputError(f"input {path} is truncated or corrupt: {e}") from e
    if dtype.kind not in NUMERIC_KINDS:
        raise InputError(f"input {path} has dtype {dtype}; allowed: bool, int, uint or float arrays")
    if not shape:
        raise InputError(f"input {path} holds a scalar, not an array of samples")
    return shape, fortran, dtype


def _npy(path: Path) -> np.ndarray:
    """The .npy array, its header read once: memory-mapped read-only, or read whole when small
    (mapping a file costs more than reading a few pages)."""
    with path.open("rb") as f:
        shape, fortran, dtype = _read_header(f, path)
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


def _array_reader(array: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """Batches sliced from an array in memory, or copied out of a mapped one, whose pages are
    then dropped from this process.

    The mapped file would otherwise stay resident in the worker (RSS growing with the input); the
    dropped pages remain in the OS page cache, so reading them again costs no disk access. The
    drop reaches DROP_BEHIND_BYTES back, for the pages fault-around mapped again.
    """
    if not isinstance(array, np.memmap):
        return lambda start, stop: array[start:stop]
    mm = getattr(array, "_mmap", None)
    row = array.strides[0] if array.ndim and array.flags.c_contiguous else 0
    base = array.offset % mmap.ALLOCATIONGRANULARITY  # where the data starts inside the mapping

    def fetch(start: int, stop: int) -> np.ndarray:
        batch = np.array(array[start:stop])
        if mm is not None and row:
            lo = max(0, base + start * row - DROP_BEHIND_BYTES) // mmap.PAGESIZE * mmap.PAGESIZE
            mm.madvise(mmap.MADV_DONTNEED, lo, base + stop * row - lo)
        return batch

    return fetch


def _npz_member(path: Path, key: str | None) -> tuple[str, tuple[int, ...]]:
    """Pick the array (`key`, the only one, else `X`) and read its shape from its header only."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n.removesuffix(".npy") for n in zf.namelist()]
            if key is not None and key not in names:
                raise InputError(f"input {path} has no array {key!r}; available: {', '.join(names)}")
            if key is None:
                if len(names) == 1:
                    key = names[0]
                elif "X" in names:
                    key = "X"
                else:
                    raise InputError(f"input {path} holds several arrays ({', '.join(names) or 'none'}) "
                                     "and none is named X; choose one with the input key")
            with zf.open(key + ".npy") as f:
                shape, _fortran, _dtype = _read_header(f, path)
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as e:
        raise InputError(f"input {path} is truncated or corrupt: {e}") from e
    return key, shape


def _csv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, cells) for each non-blank data line; a non-numeric first line is a header."""
    with path.open(encoding="utf-8", errors="replace") as f:
        rows = [(n, line.strip().split(",")) for n, line in enumerate(f, 1) if line.strip()]
    return rows[1:] if rows and not _numeric(rows[0][1]) else rows


def _numeric(cells: list[str]) -> bool:
    try:
        [float(c) for c in cells]
    except ValueError:
        return False
    return True


def _csv(path: Path) -> np.ndarray:
    """The whole CSV as a 2-D float32 array, naming the line of any bad cell or ragged row."""
    rows = _csv_rows(path)
    width = len(rows[0][1]) if rows else 0
    out = np.empty((len(rows), width), dtype=np.float32)
    for i, (line, cells) in enumerate(rows):
        if len(cells) != width:
            raise InputError(f"input {path} line {line} has {len(cells)} values, expected {width}")
        try:
            out[i] = [float(c) for c in cells]
        except ValueError as e:
            raise InputError(f"input {path} line {line} has a non-numeric value: {e}") from e
    return out


def _images(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _idx(path: Path) -> Path:
    idx = path.with_suffix(".idx")
    if not idx.is_file():
        raise InputError(f"input {path} has no index {idx.name} beside it (RecordIO needs .rec + .idx)")
    return idx


def count_samples(path: Path, key: str | None = None) -> int:
    """Number of samples, from headers and line counts only; never imports mxnet."""
    kind = _kind(path)
    if kind == "npy":
        with path.open("rb") as f:
            return _read_header(f, path)[0][0]
    if kind == "npz":
        return _npz_member(path, key)[1][0]
    if kind == "csv":
        return len(_csv_rows(path))
    if kind == "images":
        return len(_images(path))
    with _idx(path).open() as f:
        return sum(1 for line in f if line.strip())


@dataclass
class InputSource:
    path: Path
    count: int  # number of samples
    sample_shape: tuple[int, ...]  # shape of one sample as the model sees it
    fetch: Callable[[int, int], Any] = field(repr=False)  # raw samples [start, stop)
    preprocess: Preprocess = field(default_factory=Preprocess)  # the model's input scaling

    def read(self, start: int, stop: int) -> np.ndarray:
        """Samples [start, stop) as the model takes them: float32 (stop-start, *sample_shape),
        scaled by its preprocessing; only that batch is read."""
        if not 0 <= start <= stop <= self.count:
            raise IndexError(f"samples [{start}, {stop}) out of range for {self.count} in {self.path}")
        batch = np.asarray(self.fetch(start, stop), dtype=np.float32)
        return self.preprocess.apply(batch.reshape((stop - start, *self.sample_shape)))


def _check_shape(path: Path, shape: tuple[int, ...], want: tuple[int, ...]) -> None:
    """Exact match, or equal size when either side is flat (8x8 digits into an MLP of 64)."""
    if shape == want:
        return
    if math.prod(shape) == math.prod(want) and (len(shape) == 1 or len(want) == 1):
        return
    raise InputError(f"input {path} has samples of shape {shape} but model expects {want}")


def _image_channels(path: Path, input_shape: tuple[int, ...], layout: str = "NCHW") -> None:
    channels = input_shape[-1] if layout == "NHWC" else input_shape[0] if input_shape else 0
    if len(input_shape) != 3 or channels not in (1, 3):
        form = "(H, W, C)" if layout == "NHWC" else "(C, H, W)"
        raise InputError(f"input {path} holds images, so the model input must be {form} with C 1 "
                         f"or 3, not {input_shape}")


@dataclass(frozen=True)
class _ImageShape:
    """Where the model wants an image's channels (NCHW: first, NHWC: last) and its size."""

    channels: int
    height: int
    width: int
    last: bool  # NHWC

    @classmethod
    def of(cls, shape: tuple[int, ...], layout: str) -> _ImageShape:
        if layout == "NHWC":
            return cls(shape[2], shape[0], shape[1], True)
        return cls(shape[0], shape[1], shape[2], False)

    @property
    def flag(self) -> int:
        """MXNet's decode flag: 0 grey, 1 colour."""
        return 0 if self.channels == 1 else 1


def _to_model(img: Any, shape: _ImageShape) -> np.ndarray:
    """HWC mx NDArray -> float32 at the model's (H, W) in its layout, values 0..255 as decoded."""
    from mxq.tasks.mx import mx

    if img.shape[:2] != (shape.height, shape.width):
        img = mx.image.imresize(img, shape.width, shape.height)
    pixels = img.asnumpy().astype(np.float32)
    return pixels if shape.last else pixels.transpose(2, 0, 1)


def _image_reader(files: list[Path], shape: _ImageShape) -> Callable[[int, int], np.ndarray]:
    def fetch(start: int, stop: int) -> np.ndarray:
        from mxq.tasks.mx import mx

        out = []
        for f in files[start:stop]:
            try:
                img = mx.image.imread(str(f), flag=shape.flag)
            except mx.base.MXNetError as e:
                reason = str(e).strip().splitlines()[-1]
                raise InputError(f"input {f} is not a decodable image: {reason}") from e
            out.append(_to_model(img, shape))
        return np.stack(out)

    return fetch


def _record_reader(path: Path, idx: Path, shape: _ImageShape) -> Callable[[int, int], np.ndarray]:
    """Records are opened per batch: no handle outlives a read, so the source survives forks."""

    def fetch(start: int, stop: int) -> np.ndarray:
        from mxq.tasks.mx import mx

        rec = mx.recordio.MXIndexedRecordIO(str(idx), str(path), "r")
        try:
            out = []
            for key in rec.keys[start:stop]:
                _header, payload = mx.recordio.unpack(rec.read_idx(key))
                try:  # unpack_img needs cv2; imdecode is MXNet's own decoder (RGB, like imread)
                    img = mx.image.imdecode(payload, flag=shape.flag)
                except mx.base.MXNetError as e:
                    raise InputError(f"input {path} record {key} is not a decodable image") from e
                out.append(_to_model(img, shape))
            return np.stack(out)
        finally:
            rec.close()

    return fetch


def _npz_reader(path: Path, key: str) -> Callable[[int, int], np.ndarray]:
    """An .npz member is loaded on the first read: members are zipped, so they can't be memory-mapped."""
    cache: dict[str, np.ndarray] = {}

    def fetch(start: int, stop: int) -> np.ndarray:
        if key not in cache:
            try:
                with np.load(path) as npz:
                    cache[key] = npz[key]
            except (ValueError, EOFError, OSError, zipfile.BadZipFile) as e:
                raise InputError(f"input {path} is truncated or corrupt: {e}") from e
        return cache[key][start:stop]

    return fetch


def open_input(path: Path, input_shape: tuple[int, ...], key: str | None = None,
               preprocess: Preprocess | None = None) -> InputSource:
    """Open an already-resolved input for a model whose single-sample input shape is
    `input_shape` and which takes its input scaled by `preprocess` (images in its layout)."""
    input_shape = tuple(input_shape)
    preprocess = preprocess or Preprocess()
    kind = _kind(path)
    fetch: Callable[[int, int], Any]
    if kind in ("images", "rec"):
        _image_channels(path, input_shape, preprocess.layout)
        image = _ImageShape.of(input_shape, preprocess.layout)
        fetch = (_image_reader(_images(path), image) if kind == "images"
                 else _record_reader(path, _idx(path), image))
        count, sample_shape = count_samples(path, key), input_shape
    elif kind == "npz":
        key, shape = _npz_member(path, key)
        fetch, count, sample_shape = _npz_reader(path, key), shape[0], shape[1:]
    else:
        array = _npy(path) if kind == "npy" else _csv(path)
        fetch = _array_reader(array)
        count, sample_shape = array.shape[0], array.shape[1:]
    if count == 0:
        raise InputError(f"input {path} holds no samples")
    _check_shape(path, tuple(sample_shape), input_shape)
    return InputSource(path, count, input_shape, fetch, preprocess)
