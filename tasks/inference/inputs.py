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

from mxq.errors import UserError, reason
from mxq.preprocess import Preprocess
from mxq.tasks.inference.image_headers import ImageHeaderError, image_size

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


FLOAT32_MAX = float(np.finfo(np.float32).max)
LISTED_NAMES = 10  # an error lists this many of an .npz's arrays, then how many there are


@dataclass(frozen=True)
class Limits:
    """What an input may decode to, whatever its size on disk (an .npz of 995 KB can hold
    1 GiB, a PNG of 875 KB 900 MB of pixels): array bytes and image pixels."""

    max_bytes: int  # MXQ_MAX_INPUT_BYTES
    max_pixels: int  # MXQ_MAX_IMAGE_PIXELS

    @classmethod
    def of_process(cls) -> Limits:
        from mxq.workers.settings import get_settings

        s = get_settings()
        return cls(s.max_input_bytes, s.max_image_pixels)

    def check_bytes(self, path: Path, what: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        size = math.prod(shape) * dtype.itemsize
        if size > self.max_bytes:
            raise InputError(f"input {path} {what}holds {size:,} bytes of {dtype} {shape} when read, "
                             f"more than the {self.max_bytes:,} allowed (MXQ_MAX_INPUT_BYTES)")

    def check_image(self, where: str, data: bytes) -> None:
        """A whole PNG or JPEG of at most max_pixels, judged from its header before decoding."""
        try:
            width, height = image_size(data)
        except ImageHeaderError as e:
            raise InputError(f"input {where} is not a whole PNG or JPEG image: it is {e}") from None
        if not width or not height:
            raise InputError(f"input {where} is {width}x{height} pixels")
        if width * height > self.max_pixels:
            raise InputError(f"input {where} is {width}x{height} pixels ({width * height:,}), more than "
                             f"the {self.max_pixels:,} allowed (MXQ_MAX_IMAGE_PIXELS)")


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED_NAMES]) or "none"
    return shown if len(names) <= LISTED_NAMES else f"{shown}, … ({len(names)} arrays)"


def regular_file(path: Path, what: str = "input") -> Path:
    """`path` if it is a regular file (after symlinks): a FIFO or a device would block the
    worker in open() for good, with its heartbeat still fresh."""
    if not path.is_file():
        raise InputError(f"{what} {path} is not a regular file (a FIFO, socket or device?)")
    return path


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
        try:
            dtype = np.dtype(descr)
        except TypeError:
            raise ValueError(f"its header names the dtype {descr!r}, which is not a NumPy dtype") from None
        return tuple(int(n) for n in dims.split(",") if n.strip()), fortran == "True", dtype
    f.seek(start)
    return _HEADER_READERS[np.lib.format.read_magic(f)](f)


def _read_header(f: Any, path: Path) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from an .npy header, reading no data; rejects
    non-numeric dtypes."""
    try:
        shape, fortran, dtype = _parse_header(f)
    except (ValueError, TypeError, SyntaxError) as e:  # NumPy's own reader raises all three
        raise InputError(f"input {path} is truncated or corrupt: {e}") from None
    if dtype.kind not in NUMERIC_KINDS:
        raise InputError(f"input {path} has dtype {dtype}; allowed: bool, int, uint or float arrays")
    if not shape:
        raise InputError(f"input {path} holds a scalar, not an array of samples")
    return shape, fortran, dtype


def _npy(path: Path, limits: Limits | None = None) -> np.ndarray:
    """The .npy array, its header read once: memory-mapped read-only, or read whole when small
    (mapping a file costs more than reading a few pages)."""
    with regular_file(path).open("rb") as f:
        shape, fortran, dtype = _read_header(f, path)
        (limits or Limits.of_process()).check_bytes(path, "", shape, dtype)
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


def _npz_member(path: Path, key: str | None, limits: Limits | None = None) -> tuple[str, tuple[int, ...]]:
    """Pick the array (`key`, the only one, else `X`) and read its shape from its header only;
    with `limits`, refuse one that would decompress past them."""
    try:
        with zipfile.ZipFile(regular_file(path)) as zf:
            names = [n.removesuffix(".npy") for n in zf.namelist()]
            if key is not None and key not in names:
                raise InputError(f"input {path} has no array {key!r}; available: {_names(names)}")
            if key is None:
                if len(names) == 1:
                    key = names[0]
                elif "X" in names:
                    key = "X"
                else:
                    raise InputError(f"input {path} holds several arrays ({_names(names)}) "
                                     "and none is named X; choose one with the input key")
            with zf.open(key + ".npy") as f:
                shape, _fortran, dtype = _read_header(f, path)
            if limits is not None:
                limits.check_bytes(path, f"array {key!r} ", shape, dtype)
                unpacked = zf.getinfo(key + ".npy").file_size
                if unpacked > limits.max_bytes:
                    raise InputError(f"input {path} array {key!r} unpacks to {unpacked:,} bytes, more "
                                     f"than the {limits.max_bytes:,} allowed (MXQ_MAX_INPUT_BYTES)")
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as e:
        raise InputError(f"input {path} is truncated or corrupt: {e}") from e
    return key, shape


def _csv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, cells) for each non-blank data line; a non-numeric first line is a header."""
    # utf-8-sig: a BOM (Excel writes one) is not part of the first cell, so a numeric first
    # line stays data instead of being taken for a header.
    with regular_file(path).open(encoding="utf-8-sig", errors="replace") as f:
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


def _idx(path: Path) -> Path:
    idx = path.with_suffix(".idx")
    if not idx.exists():
        raise InputError(f"input {path} has no index {idx.name} beside it (RecordIO needs .rec + .idx)")
    if not idx.resolve().is_relative_to(path.resolve().parent):
        raise InputError(f"input {path} has an index {idx.name} that leads outside its folder")
    return regular_file(idx, "the index of input")


def count_samples(path: Path, key: str | None = None) -> int:
    """Number of samples, from headers and line counts only; never imports mxnet."""
    kind = _kind(path)
    if kind == "npy":
        with regular_file(path).open("rb") as f:
            return _read_header(f, path)[0][0]
    if kind == "npz":
        return _npz_member(path, key)[1][0]
    if kind == "csv":
        return len(_csv_rows(path))
    if kind == "images":
        return len(_images(path))
    return len(_index_keys(path, _idx(path)))


def _index_keys(path: Path, idx: Path) -> list[int]:
    """The record keys a RecordIO index lists (`key<TAB>offset` per line), or one error naming the
    line that is not one (MXNet's own reader answers a traceback)."""
    keys = []
    with idx.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2 or not all(p.isdecimal() for p in parts):
                raise InputError(f"input {path} has an index {idx.name} whose line {n} is not "
                                 f"'key<TAB>offset': {line.strip()[:60]!r}")
            keys.append(int(parts[0]))
    return keys


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
        raw = np.asarray(self.fetch(start, stop))
        if raw.dtype.kind == "f" and raw.dtype.itemsize > 4:
            self._check_float32_range(raw, start)
        batch = raw.astype(np.float32, copy=False)
        return self.preprocess.apply(batch.reshape((stop - start, *self.sample_shape)))

    def _check_float32_range(self, raw: np.ndarray, start: int) -> None:
        """A finite float64 beyond float32's range would become inf without a word."""
        over = np.isfinite(raw) & (np.abs(raw) > FLOAT32_MAX)
        if over.any():
            at = tuple(np.argwhere(over)[0])  # the first one, in sample order
            sample, value = int(at[0]), raw[at]
            raise InputError(f"input {self.path} has {value:g} in sample {start + sample}, beyond "
                             f"float32's range (±{FLOAT32_MAX:.4g}), which models compute in")


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
    from mxq.tasks.runtimes.mx import mx

    if img.shape[:2] != (shape.height, shape.width):
        img = mx.image.imresize(img, shape.width, shape.height)
    pixels = img.asnumpy().astype(np.float32)
    return pixels if shape.last else pixels.transpose(2, 0, 1)


def _decode(data: bytes, where: str, shape: _ImageShape, limits: Limits) -> Any:
    """One image, its header checked first (format, whole, pixels), then decoded by MXNet."""
    from mxq.tasks.runtimes.mx import mx

    limits.check_image(where, data)
    try:
        return mx.image.imdecode(data, flag=shape.flag)
    except mx.base.MXNetError as e:
        raise InputError(f"input {where} is not a decodable image: {reason(e)}") from None


def _image_reader(files: list[Path], shape: _ImageShape, limits: Limits) -> Callable[[int, int], np.ndarray]:
    def fetch(start: int, stop: int) -> np.ndarray:
        out = []
        for f in files[start:stop]:
            img = _decode(regular_file(f).read_bytes(), str(f), shape, limits)
            out.append(_to_model(img, shape))
        return np.stack(out)

    return fetch


def _record_reader(path: Path, idx: Path, shape: _ImageShape,
                   limits: Limits) -> Callable[[int, int], np.ndarray]:
    """Records are opened per batch: no handle outlives a read, so the source survives forks."""

    def fetch(start: int, stop: int) -> np.ndarray:
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
                out.append(_to_model(_decode(payload, f"{path} record {key}", shape, limits), shape))
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
               preprocess: Preprocess | None = None, limits: Limits | None = None) -> InputSource:
    """Open an already-resolved input for a model whose single-sample input shape is
    `input_shape` and which takes its input scaled by `preprocess` (images in its layout), within
    `limits` (default: the process settings')."""
    input_shape = tuple(input_shape)
    preprocess = preprocess or Preprocess()
    limits = limits or Limits.of_process()
    kind = _kind(path)
    fetch: Callable[[int, int], Any]
    if kind in ("images", "rec"):
        _image_channels(path, input_shape, preprocess.layout)
        image = _ImageShape.of(input_shape, preprocess.layout)
        if kind == "images":  # listed (and each file checked) once, for the count and the reads
            files = _images(path)
            fetch, count = _image_reader(files, image, limits), len(files)
        else:
            idx = _idx(path)
            fetch, count = _record_reader(path, idx, image, limits), len(_index_keys(path, idx))
        sample_shape = input_shape
    elif kind == "npz":
        key, shape = _npz_member(path, key, limits)
        fetch, count, sample_shape = _npz_reader(path, key), shape[0], shape[1:]
    else:
        array = _npy(path, limits) if kind == "npy" else _csv(path)
        fetch = _array_reader(array)
        count, sample_shape = array.shape[0], array.shape[1:]
    if count == 0:
        raise InputError(f"input {path} holds no samples")
    _check_shape(path, tuple(sample_shape), input_shape)
    return InputSource(path, count, input_shape, fetch, preprocess)
