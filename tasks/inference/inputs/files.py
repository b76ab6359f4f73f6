"""What every input reader shares: the one error for a bad input, the check that a path is a
regular file before anything opens it, and opening an input that may be a local file or an
object of the store (`mxq.workers.storage`) as one kind of binary file."""

from __future__ import annotations

import io
from pathlib import Path
from typing import IO

from mxq.errors import UserError
from mxq.workers.storage.locate import Location
from mxq.workers.storage.ranged import HEADER_BLOCK_BYTES, RemoteObject, RemotePrefix

__all__ = ["InputError", "Location", "RemoteObject", "RemotePrefix", "open_binary", "regular_file"]


class InputError(UserError):
    """Bad input; the message names the file and the problem."""


def regular_file(path: Path, what: str = "input") -> Path:
    """`path` if it is a regular file (after symlinks): a FIFO or a device would block the
    worker in open() for good, with its heartbeat still fresh."""
    if not path.is_file():
        raise InputError(f"{what} {path} is not a regular file (a FIFO, socket or device?)")
    return path


def open_binary(location: Location, headers_only: bool = False) -> IO[bytes]:
    """`location` opened for reading: a regular file, or an object read by ranges. An object
    opened for its headers only (a count at submit) reads small blocks and nothing ahead."""
    if isinstance(location, Path):
        return regular_file(location).open("rb")
    if isinstance(location, RemotePrefix):
        raise InputError(f"input {location} is a prefix (a folder of images), not one object")
    reader = location.open(HEADER_BLOCK_BYTES, ahead=0) if headers_only else location.open()
    return io.BufferedReader(reader, buffer_size=HEADER_BLOCK_BYTES)
