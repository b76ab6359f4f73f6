"""Input readers for bulk inference: .npy, .npz, .csv, .parquet, a folder of images, MXNet
RecordIO; the first four also from an object store (`s3://`, read by ranges).

One module per format (`npy`, `npz`, `csv`, `parquet`, `images`, `recordio`), chosen by `formats.format_of`
behind `open_input` and `count_samples`; what they share is in `files` (the error, regular files),
`limits` (what an input may decode to), `pixels` (an image as a model takes it) and `source`
(what an opened input reads). Every reader counts its samples cheaply up front and reads them a
batch at a time, so a large .npy file is memory-mapped and never loaded whole. mxnet is imported
only when an image is decoded: the CLI process validates inputs with `inside_root` and
`count_samples` and must stay light.

Imports (of mxq): core, workers, tasks.inference, tasks.runtimes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mxq.preprocess import Preprocess
from mxq.tasks.inference.inputs import csv, images, npy, npz, parquet, recordio
from mxq.tasks.inference.inputs.files import InputError, Location, RemoteObject
from mxq.tasks.inference.inputs.formats import IMAGE_SUFFIXES, format_of, on_disk
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.pixels import ImageShape, check_channels
from mxq.tasks.inference.inputs.source import InputSource, Samples

__all__ = ["IMAGE_SUFFIXES", "InputError", "InputSource", "Limits", "count_samples", "open_input"]


def count_samples(path: Location, key: str | None = None) -> int:
    """Number of samples, from headers and line counts only; never imports mxnet."""
    kind = format_of(path)
    if kind == "npy":
        return npy.count(path)
    if kind == "npz":
        return npz.count(path, key)
    if kind == "csv":
        return csv.count(path)
    if kind == "parquet":
        return parquet.count(path)
    if kind == "images" and not isinstance(path, RemoteObject):
        return images.count(path)
    return recordio.count(on_disk(path))


def open_input(path: Location, input_shape: tuple[int, ...], key: str | None = None,
               preprocess: Preprocess | None = None, limits: Limits | None = None,
               columns: list[str] | None = None) -> InputSource:
    """Open an already-resolved input (a local path, or an object of the store) for a model
    whose single-sample input shape is `input_shape` and which takes its input scaled by
    `preprocess` (images in its layout), within `limits` (a job passes its settings':
    `Limits.of`; by default the default settings');
    `key` names an .npz's array, `columns` a Parquet file's."""
    input_shape = tuple(input_shape)
    preprocess = preprocess or Preprocess()
    samples = _samples(path, input_shape, Choice(key, columns), preprocess.layout,
                       limits or Limits())
    if samples.count == 0:
        raise InputError(f"input {path} holds no samples")
    _check_shape(path, samples.shape, input_shape)
    return InputSource(path, samples.count, input_shape, samples.fetch, preprocess)


@dataclass(frozen=True)
class Choice:
    """Which part of an input holds the samples: an .npz's array, a Parquet file's columns."""

    key: str | None = None
    columns: list[str] | None = None


def _samples(path: Location, input_shape: tuple[int, ...], choice: Choice, layout: str,
             limits: Limits) -> Samples:
    """The samples of `path`, read by its format's module."""
    kind = format_of(path)
    if kind == "npy":
        return npy.opened(path, limits)
    if kind == "npz":
        return npz.opened(path, choice.key, limits)
    if kind == "csv":
        return csv.opened(path)
    if kind == "parquet":
        return parquet.opened(path, choice.columns, limits)
    check_channels(path, input_shape, layout)
    image = ImageShape.of(input_shape, layout)
    if kind == "images" and not isinstance(path, RemoteObject):
        return images.opened(path, image, limits)
    return recordio.opened(on_disk(path), image, limits)


def _check_shape(path: Location, shape: tuple[int, ...], want: tuple[int, ...]) -> None:
    """Exact match, or equal size when either side is flat (8x8 digits into an MLP of 64)."""
    if shape == want:
        return
    if math.prod(shape) == math.prod(want) and (len(shape) == 1 or len(want) == 1):
        return
    raise InputError(f"input {path} has samples of shape {shape} but model expects {want}")
