"""Process identity: a PID with the creation time and command line it had when recorded.

A PID alone names whatever process holds that number now: after a crash or a reboot it may be
a stranger (a shell, another user's server), and signalling it kills the wrong thing. Every
record mxq keeps of a process it started (`launcher-NODE.pid`, the launcher's groups file, the
embedded Redis) holds a `Proc`; `matches` checks it against /proc before any signal, and a
record that does not match is stale: ignored, never signalled.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")
# What of a command line a record keeps: enough to tell programs apart in messages and checks.
MAX_COMMAND_CHARS = 300


@dataclass(frozen=True)
class Proc:
    """A process as recorded: its PID, start time (clock ticks after boot, /proc/PID/stat field
    22) and command line (its arguments joined by spaces)."""

    pid: int
    start: int
    command: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _one_line(raw: bytes) -> str:
    """A command line as records keep it: NUL-separated arguments joined by single spaces."""
    return " ".join(raw.decode(errors="replace").replace("\0", " ").split())[:MAX_COMMAND_CHARS]


def command_of(pid: int) -> str | None:
    try:
        return _one_line((PROC / str(pid) / "cmdline").read_bytes())
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot), or None when it does not run (gone, or a
    zombie)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def identify(pid: int) -> Proc | None:
    """The process that holds `pid` now, or None when none runs (gone, or a zombie)."""
    start = _start_time(pid)
    if start is None:
        return None
    command = command_of(pid)
    return Proc(pid, start, command) if command is not None else None


def started(pid: int, argv: Sequence[str]) -> Proc | None:
    """The identity of a child just started with `argv`, or None when it already ended.

    Its command line is taken from `argv`, not read back: right after exec, /proc/PID/cmdline
    can still be empty, since the kernel closes the close-on-exec pipe Popen waits on before it
    sets the new arguments (read at once after a Popen without preexec_fn, 193 of 200 were
    empty here), and a record with an empty command would never match its process again."""
    start = _start_time(pid)
    if start is None:
        return None
    return Proc(pid, start, _one_line(b"\0".join(os.fsencode(a) for a in argv)))


def stopped(pid: int) -> bool:
    """The process is stopped by a signal (SIGSTOP, Ctrl-Z: state T) or by a debugger (t)."""
    fields = _stat(pid)
    return fields is not None and fields[0] in ("T", "t")


def group_of(pid: int) -> int | None:
    """The process group of `pid`, or None when it no longer runs."""
    fields = _stat(pid)
    return int(fields[2]) if fields is not None else None


def me() -> Proc:
    """This process."""
    found = identify(os.getpid())
    assert found is not None
    return found


def matches(record: Proc) -> bool:
    """The recorded process still runs: same PID, same start time, same command line."""
    return identify(record.pid) == record


def parse(text: str) -> Proc | None:
    """A record written by `Proc.to_json`; None for anything else (a bare PID of an older
    version, a hand-edited file): such a record cannot be checked, so it is never trusted."""
    try:
        raw = json.loads(text)
        return Proc(int(raw["pid"]), int(raw["start"]), str(raw["command"]))
    except (ValueError, TypeError, KeyError):
        return None


def read(path: Path) -> Proc | None:
    try:
        return parse(path.read_text())
    except OSError:
        return None


def write(path: Path, proc: Proc) -> None:
    """Replace the record at `path` whole (a reader never sees half a record)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(proc.to_json())
    tmp.replace(path)


def group_members(group: int) -> list[int]:
    """The running processes (not zombies) whose process group is `group`."""
    found = []
    for stat in PROC.glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == group:
            found.append(int(stat.parent.name))
    return found


def group_is(record: Proc) -> bool:
    """The group `record` led is still that one: its leader matches, or the leader died and
    what runs in the group started no earlier than it (Linux never hands a PID to a new process
    while a group of that number has members, so these are the leader's own children)."""
    leader = identify(record.pid)
    if leader is not None:
        return leader == record
    starts = [p.start for p in map(identify, group_members(record.pid)) if p is not None]
    return bool(starts) and min(starts) >= record.start
