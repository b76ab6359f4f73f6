"""Training datasets: `.npz` (X, y), CSV with a label column, image folder (one subfolder per
class), MXNet RecordIO, and the built-in `digits` (scikit-learn's bundled set); `.npz` and CSV
also as objects in a bucket (`s3://`). All loaded whole: training reads every sample every
epoch."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mxq.preprocess import Preprocess
from mxq.tasks.inference.inputs import IMAGE_SUFFIXES, InputError, Limits, open_input
from mxq.tasks.inference.inputs.files import Location, open_binary

BUILTIN = ("digits",)


@dataclass
class Dataset:
    x: NDArray[np.float32]  # (N, *sample_shape), as stored
    y: NDArray[np.int32]  # (N,)
    classes: int
    source: str
    # How the net sees `x` in training, registered with the trained version so that inference
    # over inputs stored like `x` scales them the same way.
    preprocess: Preprocess = field(default_factory=Preprocess)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def for_training(self) -> Dataset:
        """`x` scaled as the net trains on it; `preprocess` still says how, for the version the
        training registers."""
        return replace(self, x=self.preprocess.apply(self.x))


def _labels(y: NDArray[Any], source: str) -> tuple[NDArray[np.int32], int]:
    if y.ndim != 1 or not len(y):
        raise InputError(f"dataset {source} needs one label per sample (got labels of shape {y.shape})")
    if not np.all(np.isfinite(y)) or np.any(y != np.round(y)) or y.min() < 0:
        raise InputError(f"dataset {source} labels must be class indexes 0, 1, 2, ... "
                         f"(found values from {y.min()} to {y.max()})")
    classes = int(y.max()) + 1
    if classes < 2:
        raise InputError(f"dataset {source} has a single class; training needs at least 2")
    return y.astype(np.int32), classes


def digits() -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    y, classes = _labels(d.target, "digits")
    # Pixels are 0..16 as scikit-learn stores them; the net sees them over 16.
    return Dataset(d.images.astype(np.float32)[:, None], y, classes, "digits", Preprocess(scale=1 / 16))


def _npz(path: Location) -> Dataset:
    try:
        with open_binary(path) as raw, np.load(raw) as f:
            missing = {"X", "y"} - set(f.files)
            if missing:
                raise InputError(f"dataset {path} needs arrays X and y; it has {', '.join(f.files)}")
            x, y = f["X"], f["y"]
    except (OSError, ValueError) as exc:
        raise InputError(f"dataset {path} is not a readable .npz: {exc}") from None
    if len(x) != len(y):
        raise InputError(f"dataset {path} has {len(x)} samples but {len(y)} labels")
    labels, classes = _labels(y, str(path))
    return Dataset(np.asarray(x, dtype=np.float32), labels, classes, str(path))


def _csv(path: Location, label_column: str) -> Dataset:
    with io.TextIOWrapper(open_binary(path), newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise InputError(f"dataset {path} needs a header line and at least one sample")
    header = [h.strip() for h in rows[0]]
    if label_column not in header:
        raise InputError(f"dataset {path} has no label column {label_column!r}; columns: "
                         f"{', '.join(header)}")
    at = header.index(label_column)
    try:
        table = np.array([[float(v) for v in r] for r in rows[1:] if r], dtype=np.float64)
    except ValueError as exc:
        raise InputError(f"dataset {path} has a non-numeric value: {exc}") from None
    labels, classes = _labels(table[:, at], str(path))
    return Dataset(np.delete(table, at, axis=1).astype(np.float32), labels, classes, str(path))


def _images(path: Path, shape: tuple[int, ...], limits: Limits) -> Dataset:
    classes = sorted(p for p in path.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise InputError(f"dataset {path} needs one subfolder per class (at least 2)")
    xs, ys = [], []
    for label, folder in enumerate(classes):
        if any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir()):
            source = open_input(folder, shape, limits=limits)
            xs.append(source.read(0, source.count))
            ys.append(np.full(source.count, label, np.int32))
    return Dataset(np.concatenate(xs), np.concatenate(ys), len(classes), str(path))


def _recordio(path: Path, shape: tuple[int, ...], limits: Limits) -> Dataset:
    from mxq.tasks.runtimes.mx import mx

    source = open_input(path, shape, limits=limits)
    reader = mx.recordio.MXIndexedRecordIO(str(path.with_suffix(".idx")), str(path), "r")
    try:
        y = np.array([mx.recordio.unpack(reader.read_idx(k))[0].label for k in reader.keys])
    finally:
        reader.close()
    labels, classes = _labels(np.asarray(y, dtype=np.float64).reshape(-1), str(path))
    return Dataset(source.read(0, source.count), labels, classes, str(path))


def load(path: Location | str, image_shape: tuple[int, ...] | None = None,
         label_column: str = "label", limits: Limits | None = None) -> Dataset:
    """The dataset at `path` (already confined to the data root, or an object of an allowed
    bucket) or a built-in one by name; images decoded within `limits` (a job's: `Limits.of`)."""
    limits = limits or Limits()
    if str(path) in BUILTIN:
        return digits()
    path = Path(path) if isinstance(path, str) else path
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _npz(path)
    if suffix == ".csv":
        return _csv(path, label_column)
    if not isinstance(path, Path):
        raise InputError(f"dataset {path}: from object storage mxq trains on .npz (X, y) and .csv "
                         "with a label column; image folders and RecordIO are read from local disk")
    if path.is_dir():
        return _images(path, image_shape or (3, 32, 32), limits)
    if suffix == ".rec":
        return _recordio(path, image_shape or (3, 32, 32), limits)
    raise InputError(f"dataset {path} has an unsupported format; supported: digits, .npz with X and y, "
                     ".csv with a label column, an image folder with one subfolder per class, .rec + .idx")


def split(ds: Dataset, val_fraction: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """A seeded shuffle, then the last `val_fraction` of it for validation."""
    order = np.random.default_rng(seed).permutation(len(ds.y))
    n_val = int(round(len(order) * val_fraction))
    if n_val == 0:
        return ds, None
    train, val = order[:-n_val], order[-n_val:]
    return (replace(ds, x=ds.x[train], y=ds.y[train]), replace(ds, x=ds.x[val], y=ds.y[val]))
