"""What every input reader shares: the one error for a bad input, and the check that a path is a
regular file before anything opens it."""

from __future__ import annotations

from pathlib import Path

from mxq.errors import UserError


class InputError(UserError):
    """Bad input; the message names the file and the problem."""


def regular_file(path: Path, what: str = "input") -> Path:
    """`path` if it is a regular file (after symlinks): a FIFO or a device would block the
    worker in open() for good, with its heartbeat still fresh."""
    if not path.is_file():
        raise InputError(f"{what} {path} is not a regular file (a FIFO, socket or device?)")
    return path
