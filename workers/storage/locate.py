"""Where a user's location points: a path confined to the data root, or an `s3://` object
confined to the buckets MXQ_S3_ALLOWED names (and that exists, with its size)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from mxq.objects import ObjectURL, confined, is_object_url
from mxq.workers.paths import confine
from mxq.workers.storage.ranged import IMAGE_SUFFIXES, RemoteObject, RemotePrefix

if TYPE_CHECKING:
    from mxq.workers.settings import Settings

Location = Path | RemoteObject | RemotePrefix
"""A checked input: a local file or folder, an object of the store, or the objects under a
prefix (`s3://b/images/`, a folder of images)."""

ALLOWED_SETTING = "MXQ_S3_ALLOWED"


def allowed_url(settings: Settings, text: str, what: str = "input") -> ObjectURL:
    """`text` as an `s3://` location inside MXQ_S3_ALLOWED (nothing is asked of the store), or
    a one-line error naming what, the location and the setting."""
    return confined(text, settings.s3_allowed_prefixes, ALLOWED_SETTING, what)


def locate(settings: Settings, text: str | Path, what: str = "input") -> Location:
    """`text` checked: an `s3://bucket/key` inside the allowed buckets and present (one HEAD),
    a prefix there (`s3://bucket/folder/`, listed), or a path inside the data root; else a
    one-line error naming the setting that confines it."""
    if isinstance(text, str) and is_object_url(text):
        url = allowed_url(settings, text, what)
        if url.key.endswith("/"):
            return RemotePrefix.at(settings, url)
        return RemoteObject.at(settings, url)
    return confine(settings, text, what)


def identity(location: Location) -> str | None:
    """What says an input is still the one a job was submitted with: a file's size, mtime and
    inode, an object's size and ETag; for a folder or a prefix, its images' count and a digest of
    each one's name and identity (a chunk or a later attempt lists the same images, each read then
    checked against its listing). None for what is not there."""
    if isinstance(location, RemoteObject):
        return f"object {location.size} bytes, ETag {location.etag}"
    if isinstance(location, RemotePrefix):
        return _digest("prefix", [f"{key} {size} {etag}" for key, size, etag in location.images])
    if isinstance(location, Path) and location.is_file():
        return f"file {stamp(location.stat())}"
    if isinstance(location, Path) and location.is_dir():
        images = sorted(p for p in location.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        return _digest("folder", [f"{p.name} {_stamp_of(p)}" for p in images])
    return None


def stamp(st: os.stat_result) -> str:
    """A file's version: its size, mtime and inode (a rewrite in place or a replacement changes one)."""
    return f"{st.st_size} bytes, mtime_ns {st.st_mtime_ns}, inode {st.st_ino}"


def _stamp_of(path: Path) -> str:
    try:
        return stamp(path.stat())
    except OSError:
        return "gone"


def _digest(kind: str, entries: list[str]) -> str:
    digest = hashlib.sha256("\n".join(entries).encode("utf-8", "surrogateescape")).hexdigest()
    return f"{kind} of {len(entries)} images, sha256 {digest}"


def size_of(location: Location) -> int:
    """The bytes of an input: an object, a file, or the files directly inside a folder (images)."""
    if not isinstance(location, Path):
        return location.size
    if location.is_dir():
        return sum(p.stat().st_size for p in location.iterdir() if p.is_file())
    return location.stat().st_size
