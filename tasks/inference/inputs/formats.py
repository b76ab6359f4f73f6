"""Which reader an input goes to: its format, told by a folder or by the file's suffix (an
object's by its key's)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from mxq.tasks.inference.inputs.files import InputError, Location, RemotePrefix
from mxq.workers.storage.ranged import IMAGE_SUFFIXES as IMAGE_SUFFIXES  # (beside RemotePrefix)

SUPPORTED = (".npy, .npz, .csv, .parquet, a folder of images (.png, .jpg, .jpeg), .rec with a "
             "sibling .idx")
SUPPORTED_REMOTE = ".npy, .npz, .csv, .parquet and a prefix of images (s3://BUCKET/FOLDER/)"
Format = Literal["npy", "npz", "csv", "parquet", "images", "rec"]
_BY_SUFFIX: dict[str, Format] = {".npy": "npy", ".npz": "npz", ".csv": "csv", ".parquet": "parquet",
                                 ".rec": "rec"}
REMOTE: tuple[Format, ...] = ("npy", "npz", "csv", "parquet", "images")  # what a bucket may hold


def format_of(location: Location) -> Format:
    """The format of `location`: a folder holds images, a file's suffix names the rest."""
    if isinstance(location, RemotePrefix) or (isinstance(location, Path) and location.is_dir()):
        return "images"
    kind = _BY_SUFFIX.get(location.suffix.lower())
    if kind is None:
        raise InputError(f"input {location} has an unsupported format; supported: {SUPPORTED}")
    if not isinstance(location, Path) and kind not in REMOTE:
        raise InputError(f"input {location} is a {kind} input, which mxq reads from local disk "
                         f"only; from object storage: {SUPPORTED_REMOTE}")
    return kind


def on_disk(location: Location) -> Path:
    """`location` as the local path `format_of` lets only some formats be (RecordIO, an .npy
    read by memory map): an object reaching here is a bug's, refused in words."""
    if not isinstance(location, Path):
        raise InputError(f"input {location}: this input is read from local disk only")
    return location
