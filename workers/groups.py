"""The process groups the launcher starts: one per child (each child leads its own session), so
that a child's whole tree (Celery's pool, the beat process of the schedule worker, a training's
child and its ps-lite roles) can be ended together, even the parts whose parent died first and
that now hang off PID 1.

The launcher records the groups in `$MXQ_HOME/launcher-NODE.groups` (one file per node: nodes may
share MXQ_HOME); `mxq down` ends whatever is still in them once the launcher is gone, and says so.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

GRACE_SECONDS = 5.0  # after SIGTERM, before SIGKILL


def groups_file(home: Path, node: str) -> Path:
    return home / f"launcher-{node}.groups"


def record(home: Path, node: str, groups: set[int]) -> None:
    """Write the groups of the live children (replaced whole, so it never lists a stale one twice)."""
    groups_file(home, node).write_text("".join(f"{g}\n" for g in sorted(groups)))


def recorded(home: Path, node: str) -> set[int]:
    try:
        return {int(line) for line in groups_file(home, node).read_text().split() if line.isdigit()}
    except FileNotFoundError:
        return set()


def members(group: int) -> list[int]:
    """The processes of a group that still run (zombies, already dead, are left out)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(stat.parent.name))
    return found


def end(group: int, grace: float = GRACE_SECONDS) -> int:
    """End every process of `group`: SIGTERM, then SIGKILL after `grace`; how many there were."""
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


def end_recorded(home: Path, node: str) -> int:
    """End what is left of every recorded group of `node` (its launcher is gone); how many
    processes."""
    ended = sum(end(g) for g in recorded(home, node))
    groups_file(home, node).unlink(missing_ok=True)
    return ended
