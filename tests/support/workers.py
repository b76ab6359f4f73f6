"""The device workers' processes as their heartbeats record them: a worker's PID, and the wait
for a worker (re)started after a kill."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mxq.db.fleet import list_workers
from tests.conftest import Stack, wait_until

if TYPE_CHECKING:
    from mxq.db.records import WorkerRecord


def pid_of(stack: Stack, worker: str | None) -> int:
    """The process of `worker` (a job's worker: None until the job ran somewhere)."""
    assert worker is not None
    pid = {w["name"]: w for w in list_workers(stack.settings.database, 5.0)}[worker]["pid"]
    assert pid is not None, f"{worker} has not started"
    return pid


def wait_alive(stack: Stack, worker: str | None, not_pid: int | None, timeout: float = 90) -> int:
    """The PID of `worker` once it is alive in a process other than `not_pid`."""
    assert worker is not None

    def row() -> WorkerRecord | None:
        return {w["name"]: w for w in list_workers(stack.settings.database, 5.0)}.get(worker)

    found = wait_until(row, timeout, f"{worker} to be alive with a pid other than {not_pid}",
                       until=lambda r: r and r["alive"] and r["pid"] and r["pid"] != not_pid,
                       interval=0.2)
    assert found is not None and found["pid"] is not None
    return found["pid"]
