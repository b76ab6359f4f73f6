"""Checksums of a model version's stored files: taken at registration, verified before serving.

A stored file that changes after registration (a `model.onnx` copied over from another model,
a params file replaced) would otherwise serve another model's weights without a word. Each file
is hashed once per process while its path, mtime and size stay the same, so a big model is not
re-read for every job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from mxq.errors import UserError

_verified: set[tuple[str, int, int, str]] = set()  # (path, mtime_ns, size, sha256) seen to match


class ChangedFile(UserError):
    """A stored model file no longer has the sha256 recorded when the version was registered."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def changed(what: str, path: Path, model: str) -> ChangedFile:
    """The one-line error for `what` (e.g. "ONNX file") of `model` ("name:version")."""
    name = model.rsplit(":", 1)[0]
    return ChangedFile(f"{what} {path} of {model} does not match its recorded checksum: it changed "
                       f"since registration; put the original back, or register the model again "
                       f"(`mxq models add {name} ...` makes a new version)")


def verify(path: Path, expected: str | None, what: str, model: str) -> None:
    """Raise ChangedFile unless `path` still hashes to `expected`; None (a version registered
    before this file was checksummed) is not checked. A missing file is the caller's to report."""
    if expected is None:
        return
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size, expected)
    if key in _verified:
        return
    if sha256(path) != expected:
        raise changed(what, path, model)
    _verified.add(key)
