"""The process groups the launcher starts: one per child (each child leads its own session), so
that a child's whole tree (Celery's pool, the beat process of the schedule worker, a training's
child and its ps-lite roles) can be ended together, even the parts whose parent died first and
that now hang off PID 1.

The launcher records the groups in `$MXQ_HOME/launcher-NODE.groups` (one file per node: nodes may
share MXQ_HOME), each as its leader's identity (`workers/launch/procs.py`: PID, start time, command
line); `mxq up` and `mxq down` end whatever is still in them once the launcher is gone, and say
so. A recorded group whose leader is now another process is stale and never signalled.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from mxq.workers.launch import procs
from mxq.workers.launch.procs import Proc

GRACE_SECONDS = 5.0  # after SIGTERM, before SIGKILL


def groups_file(home: Path, node: str) -> Path:
    return home / f"launcher-{node}.groups"


def record(home: Path, node: str, leaders: list[Proc]) -> None:
    """Write the leaders of the live children (replaced whole, so it never lists a stale one)."""
    path = groups_file(home, node)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(p.to_json() + "\n" for p in sorted(leaders, key=lambda p: p.pid)))
    tmp.replace(path)


def records(home: Path, node: str) -> list[Proc | None]:
    """Each recorded leader; None for a line that is no record (it cannot be checked)."""
    try:
        lines = groups_file(home, node).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [procs.parse(line) for line in lines if line.strip()]


def recorded(home: Path, node: str) -> set[int]:
    """The recorded group ids (whether or not they are still ours)."""
    return {p.pid for p in records(home, node) if p is not None}


def members(group: int) -> list[int]:
    """The processes of a group that still run (zombies, already dead, are left out)."""
    return procs.group_members(group)


def end(group: int, grace: float = GRACE_SECONDS) -> int:
    """End every process of `group`: SIGTERM, then SIGKILL after `grace`; how many there were.
    Only for a group known to be ours (a child just reaped, or `procs.group_is`)."""
    left = members(group)
    if not left:
        return 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return len(left)
        deadline = time.monotonic() + grace
        while members(group) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not members(group):
            break
    return len(left)


def live_orphans(home: Path, node: str) -> list[Proc]:
    """The recorded groups that still run and are still ours (their launcher is gone)."""
    return [p for p in records(home, node) if p is not None and procs.group_is(p)]


def end_recorded(home: Path, node: str) -> tuple[int, int]:
    """End what is left of every recorded group of `node` (its launcher is gone): how many
    processes were ended, and how many records were stale (left alone)."""
    found = records(home, node)
    ours = live_orphans(home, node)
    ended = sum(end(p.pid) for p in ours)
    stale = sum(1 for p in found if p is None or (p not in ours and members(p.pid)))
    groups_file(home, node).unlink(missing_ok=True)
    return ended, stale
