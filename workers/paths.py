"""Confinement of user-given paths to their root (no `..`, no symlink escape)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mxq.errors import UserError
from mxq.names import shown

if TYPE_CHECKING:
    from mxq.workers.settings import Settings


# Under $MXQ_HOME: files handed to a worker by a process that cannot use them itself (a model a
# process without MXNet registers through a `register` job).
STAGING = "staging"


class PathError(UserError):
    """A path outside its root, or one that does not exist."""


def staging_dir(home: Path) -> Path:
    return home / STAGING


def within(path: str | Path, root: str | Path, what: str = "input",
           setting: str = "MXQ_DATA_ROOT") -> Path:
    """The resolved path (relative paths count from `root`) if it lies inside `root`, whether or
    not it exists; else PathError naming it, the root and where the root is set."""
    _check_lengths(path, what)
    base = Path(root).resolve()
    resolved = (base / Path(path)).resolve()
    if not resolved.is_relative_to(base):
        raise PathError(f"{what} {path} lies outside the data root {base} ({setting})")
    return resolved


# What Linux file systems take (NAME_MAX, PATH_MAX less its NUL): a longer name is refused where
# it enters, not by the first stat of a fire hours later ("File name too long").
NAME_BYTES, PATH_BYTES = 255, 4095


def _check_lengths(path: str | Path, what: str) -> None:
    text = str(path)
    if len(text.encode(errors="surrogateescape")) > PATH_BYTES:
        raise PathError(f"{what} {shown(text, 80)} is {len(text.encode(errors='surrogateescape')):,} "
                        f"bytes long; allowed: at most {PATH_BYTES:,} bytes a path")
    for name in Path(text).parts:
        if (size := len(name.encode(errors="surrogateescape"))) > NAME_BYTES:
            raise PathError(f"{what} {shown(text, 80)} has a name of {size:,} bytes; allowed: at "
                            f"most {NAME_BYTES} bytes a file or folder name")


def _looked_at(path: str | Path, resolved: Path, root: str | Path, setting: str) -> str:
    """Where a relative path was looked for: it counts from the root, not from the directory the
    user typed it in, and the message must not hide that."""
    if Path(path).is_absolute() and str(resolved) == str(path):
        return ""
    how = "a relative path counts from" if not Path(path).is_absolute() else "inside"
    return f" (looked for {resolved}; {how} the data root {Path(root).resolve()}, {setting})"


def inside_root(path: str | Path, root: str | Path, what: str = "input",
                setting: str = "MXQ_DATA_ROOT") -> Path:
    """The resolved path (relative paths count from `root`) of a regular file or folder inside
    `root`, or PathError saying why not."""
    resolved = within(path, root, what, setting)
    try:
        exists = resolved.exists()
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise PathError(f"{what} {str(path)[:200]} cannot be looked up: {exc.strerror}") from None
    if not exists:
        raise PathError(f"{what} {path} does not exist{_looked_at(path, resolved, root, setting)}")
    if not (resolved.is_file() or resolved.is_dir()):  # opening a FIFO blocks until a writer comes
        raise PathError(f"{what} {path} is not a regular file or folder (a FIFO, socket or device?)")
    return resolved


def confine(settings: Settings, path: str | Path, what: str = "input") -> Path:
    """`path` resolved inside the stack's data root (`Settings.inputs_root`); the error names the
    path, the root and where the root is set."""
    root, origin = settings.inputs_root_and_origin()
    return inside_root(path, root, what, origin)
