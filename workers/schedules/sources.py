"""Where a schedule's dataset comes from: a file, the newest file of a folder, or the newest match
of a glob, all inside the data root, found by a bounded walk; or in a bucket (`s3://`), the
object itself, the newest object under a prefix (`s3://b/daily/`), or the newest key matching a
glob (`s3://b/daily/*.npz`), within MXQ_S3_ALLOWED and at most MXQ_GLOB_MAX_ENTRIES listed.
An inference schedule's fire takes every match (`every_file`), not the newest.

`glob.glob("/usr/**/*.py", recursive=True)` once spun for minutes, following symlink loops, and a
source of `/etc/*` answered with the name of a file outside the data root. Here the walk starts
at the glob's fixed leading folders, which must lie inside the root; it never follows a symlinked
folder; it stops past MXQ_GLOB_MAX_ENTRIES entries or MXQ_GLOB_SECONDS; and a match that leads
outside the root (a symlinked file) is never a candidate.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from mxq.objects import ObjectURL, is_object_url
from mxq.workers.jobs.jobspecs import BUILTIN_DATASETS
from mxq.workers.paths import PathError, inside_root, within
from mxq.workers.settings import Settings
from mxq.workers.storage import client as s3
from mxq.workers.storage.locate import allowed_url

WILDCARDS = "*?["


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """`parts` (a path below the walk's start) against glob components; `**` is any depth.
    As in a shell, a hidden name (`.f1.npy.part`, what many tools write before a rename) is
    matched only by a component that starts with a dot itself, never by a wildcard or `**`."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[i:], pattern[1:]) for i in range(len(parts) + 1)
                   if not any(_hidden(p) for p in parts[:i]))
    return bool(parts) and _component(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _component(name: str, pattern: str) -> bool:
    return fnmatchcase(name, pattern) and (not _hidden(name) or _hidden(pattern))


def _split(source: str) -> tuple[Path, tuple[str, ...]]:
    """The glob's fixed leading folders and its remaining components."""
    parts = Path(source).parts
    fixed = next((i for i, p in enumerate(parts) if any(c in p for c in WILDCARDS)), len(parts))
    return Path(*parts[:fixed]) if fixed else Path("."), tuple(parts[fixed:])


class Walk:
    """A bounded walk below `start`: counts every entry it looks at, watches the clock."""

    def __init__(self, settings: Settings, source: str) -> None:
        self.source, self.seen = source, 0
        self.max_entries, self.seconds = settings.glob_max_entries, settings.glob_seconds
        self.deadline = time.monotonic() + settings.glob_seconds

    def _tick(self) -> None:
        self.seen += 1
        if self.seen > self.max_entries:
            raise PathError(f"dataset source {self.source!r} looked at more than {self.max_entries:,} "
                            "entries without finishing (MXQ_GLOB_MAX_ENTRIES): narrow the pattern")
        if time.monotonic() > self.deadline:
            raise PathError(f"dataset source {self.source!r} took more than {self.seconds:g} s to "
                            "search (MXQ_GLOB_SECONDS): narrow the pattern")

    def files(self, start: Path, pattern: tuple[str, ...]) -> list[Path]:
        """Files below `start` whose relative path matches `pattern` (symlinked folders are not
        entered, so no loop can hold the walk)."""
        deep = "**" in pattern
        found: list[Path] = []
        stack: list[tuple[Path, tuple[str, ...]]] = [(start, ())]
        while stack:
            folder, rel = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue  # unreadable or gone: nothing from it
            for entry in entries:
                self._tick()
                parts = (*rel, entry.name)
                if entry.is_dir(follow_symlinks=False):
                    if deep or len(parts) < len(pattern):
                        stack.append((Path(entry.path), parts))
                elif _matches(parts, pattern):
                    found.append(Path(entry.path))
        return found


def _bucket_prefix(settings: Settings, source: str) -> tuple[ObjectURL, str]:
    """A bucket source's fixed leading part (confined to MXQ_S3_ALLOWED) and its glob, if any."""
    at = next((i for i, c in enumerate(source) if c in WILDCARDS), len(source))
    fixed = source[:at]
    if at < len(source) and not fixed.endswith("/"):
        fixed = fixed.rsplit("/", 1)[0] + "/"
    url = allowed_url(settings, fixed, "dataset source")
    return url, source[len(str(url)):] if at < len(source) else ""


def _newest_object(settings: Settings, source: str) -> str:
    """The newest object a bucket source names (itself, under its prefix, or matching its glob)."""
    url, pattern = _bucket_prefix(settings, source)
    found = [(k, t) for k, t, _ in s3.listed(settings, url, settings.glob_max_entries)
             if _object_matches(url, k, pattern)]
    if not found:
        raise PathError(f"dataset source {source!r} matches no object")
    key = max(found, key=lambda kt: (kt[1], kt[0]))[0]
    return str(ObjectURL(url.bucket, key))


def check_source(settings: Settings, source: str) -> None:
    """Refuse, when a schedule is added, a source whose fixed leading folders lie outside the
    data root (`/etc/*`, `/usr/**/*.py`), or a bucket source outside MXQ_S3_ALLOWED: nothing
    outside them is ever listed."""
    if source in BUILTIN_DATASETS:
        return
    if is_object_url(source):
        _bucket_prefix(settings, source)
        return
    root, origin = settings.inputs_root_and_origin()
    within(_split(source)[0], root, "dataset source", origin)


@dataclass(frozen=True)
class Found:
    """One file or object a source matches, as listed: where, its size, a local file's mtime
    (ns) and an object's ETag."""

    location: str
    size: int
    mtime_ns: int | None = None
    etag: str | None = None


def every_file(settings: Settings, source: str) -> list[Found]:
    """Every file (or object) `source` matches, oldest first: what an inference schedule's fire
    considers. Bounded as `newest_file` is, and a bucket source's objects with their ETags."""
    if is_object_url(source):
        url, pattern = _bucket_prefix(settings, source)
        return [Found(str(ObjectURL(url.bucket, key)), size, etag=etag)
                for key, size, etag in sorted(s3.versions(settings, url, settings.glob_max_entries))
                if _object_matches(url, key, pattern)]
    found = []
    for path in _local_files(settings, source):
        try:
            st = path.stat()
        except OSError:
            continue  # gone since it was listed: the next fire sees what is there
        if not stat.S_ISREG(st.st_mode):
            continue  # a FIFO, socket or device is no data (reading one could block the fire)
        found.append((st.st_mtime_ns, str(path), st.st_size))
    return [Found(location, size, mtime_ns) for mtime_ns, location, size in sorted(found)]


def _object_matches(url: ObjectURL, key: str, pattern: str) -> bool:
    """Whether `key`, listed under `url`'s prefix, is a data object the source names."""
    if key.endswith("/"):
        return False  # a folder marker is no data
    if pattern:
        return fnmatchcase(key[len(url.key):], pattern)
    return url.key.endswith("/") or key == url.key or key.startswith(url.key + "/")


def _local_files(settings: Settings, source: str) -> list[Path]:
    """The files a local source matches, each inside the data root (a symlink out is no
    candidate, and its name is not told)."""
    root, origin = settings.inputs_root_and_origin()
    start, pattern = _split(source)
    base = within(start, root, "dataset source", origin)  # before anything is listed
    walk = Walk(settings, source)
    if pattern:
        candidates = walk.files(base, pattern) if base.is_dir() else []
    elif base.is_dir():
        candidates = walk.files(base, ("*",))
    else:
        candidates = [base] if base.exists() else []
    inside = []
    for path in candidates:
        try:
            inside.append(inside_root(path, root, "dataset", origin))
        except PathError:
            continue
    return inside


def newest_file(settings: Settings, source: str) -> Path | str:
    """The file a fire trains on: `source` itself, the newest file of that folder, or the newest
    match of that glob; inside the data root, or PathError saying why not. A bucket source's
    newest object, as its s3:// URL; a built-in dataset (`digits`) as its name, as `mxq train`
    takes it."""
    if source in BUILTIN_DATASETS:
        return source
    if is_object_url(source):
        return _newest_object(settings, source)
    inside = _local_files(settings, source)
    if not inside:
        root, _ = settings.inputs_root_and_origin()
        raise PathError(f"dataset source {source!r} matches no file (in {root})")
    return max(inside, key=lambda p: (p.stat().st_mtime, p.name))
