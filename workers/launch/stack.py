"""`mxq up` / `mxq down`: the embedded broker, the schema, and this node's worker launcher.

Every process is recognised by its identity (`workers/launch/procs.py`), never by a PID alone: a
launcher record naming another process is stale, removed with a word, and never signalled. A
launcher that died leaves its children running; `mxq up` (`preflight`) and `mxq down` end them.

Nodes may share one home (a second node's `mxq worker` on the same machine, or a home on a
shared disk): each node's launcher keeps its own record, `launcher-NODE.pid`. A second launcher
for a node whose launcher lives is refused; `mxq down` ends every live launcher of the home.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mxq.db.fleet import alive_since, refused_since
from mxq.db.migrate import upgrade
from mxq.db.schema import utcnow
from mxq.errors import Unavailable
from mxq.workers.hardware.unplanned import Unplanned
from mxq.workers.launch import groups, ports, procs
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.launch.launcher import (
    STOP_GRACE_SECONDS,
    Launcher,
    WorkerSpec,
    api_spec,
    schedule_spec,
)
from mxq.workers.launch.recheck import NodePlan, Recheck
from mxq.workers.settings import Settings
from mxq.workers.stack_record import record_stack

log = logging.getLogger(__name__)
UP_TIMEOUT_SECONDS = 180.0


class StackError(Unavailable):
    """The stack could not be brought up or down; the message says what to look at."""


def launcher_pidfile(settings: Settings, node: str | None = None) -> Path:
    """The record of `node`'s launcher (this node's by default)."""
    return settings.home_path / f"launcher-{node or settings.node}.pid"


# What a launcher of an mxq before per-node records wrote: read by `mxq down`, never written.
LEGACY_PIDFILE = "launcher.pid"


def prepare(settings: Settings) -> tuple[bool, list[str]]:
    """Home folder, the stack's record, embedded broker (when no broker URL is set) and schema:
    whether Redis started, and a line for each recorded setting given anew with another value."""
    settings.home_path.mkdir(parents=True, exist_ok=True)
    notes = record_stack(settings)
    started = EmbeddedRedis(settings.home_path).start() if settings.embedded_broker else False
    upgrade(settings.database)
    return started, notes


def run_launcher(settings: Settings, specs: list[WorkerSpec], with_schedule: bool = False,
                 unplanned: list[Unplanned] | None = None) -> int:
    """Supervise this node's workers in the foreground until SIGTERM or Ctrl-C; refused while
    another launcher of this node lives in this home (it would start the same workers again).
    The GPUs it plans no worker for (`unplanned`) are recorded out and planned again on its
    probe cadence (mxq.workers.launch.recheck)."""
    me = procs.me()
    pidfile = claim_node(settings, me)
    recheck = Recheck(settings, NodePlan(specs, unplanned)) if unplanned else None
    try:
        services = [schedule_spec(settings), api_spec(settings)] if with_schedule else []
        if recheck is not None:
            recheck.record()
        return Launcher(settings, [*specs, *services], recheck).run()
    finally:
        if recheck is not None:
            recheck.close()
        if procs.read(pidfile) == me:  # not a newer launcher's record
            pidfile.unlink(missing_ok=True)


def claim_node(settings: Settings, me: procs.Proc) -> Path:
    """Check that no launcher of this node lives and write `me` as its record, as one step under
    a lock on the node's lock file: unlocked, two starts of one node at once both found it free."""
    pidfile = launcher_pidfile(settings)
    with open(settings.home_path / f"launcher-{settings.node}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        check_node_free(settings)
        procs.write(pidfile, me)
    return pidfile


def check_node_free(settings: Settings) -> list[str]:
    """Refuse when this node's launcher already runs from this home: a second one would start
    the same workers (and, from `mxq up`, a second API) again. A note when its record was stale."""
    running, note = launcher_record(settings)
    if running:
        raise StackError(f"mxq is already up for node {settings.node} in {settings.home_path} "
                         f"(launcher {running.describe()}); `mxq down` stops it, or give another "
                         "launcher its own MXQ_NODE")
    return [note] if note else []


def launcher_record(settings: Settings, pidfile: Path | None = None) -> tuple[procs.Proc | None, str | None]:
    """The running launcher a record names (this node's by default), and a one-line note when
    the record was stale (it named no process, or another one: removed, never signalled)."""
    pidfile = pidfile or launcher_pidfile(settings)
    try:
        text = pidfile.read_text()
    except FileNotFoundError:
        return None, None
    found = procs.parse(text)
    if found is not None and procs.matches(found):
        return found, None
    pidfile.unlink(missing_ok=True)
    what = found.describe() if found else repr(text.strip()[:40])
    return None, (f"ignored a stale {pidfile} ({what} is not a running launcher of this "
                  "stack); removed it")


def live_launchers(settings: Settings) -> tuple[list[procs.Proc], list[str]]:
    """Every live launcher recorded in this home (each node's, and an older mxq's
    `launcher.pid`), and notes on this node's and the legacy records found stale. Another
    node's record that names no process here is left as it is: that node may run on another
    machine that shares the home."""
    live: list[procs.Proc] = []
    notes: list[str] = []
    own = launcher_pidfile(settings)
    for pidfile in sorted(settings.home_path.glob("launcher*.pid")):
        if pidfile == own or pidfile.name == LEGACY_PIDFILE:
            found, note = launcher_record(settings, pidfile)
            notes += [note] if note else []
        else:
            found = procs.read(pidfile)
            found = found if found is not None and procs.matches(found) else None
        live += [found] if found else []
    return live, notes


def preflight(settings: Settings) -> list[str]:
    """Before `mxq up` starts anything: refuse when this stack is already up or the API port is
    taken; end what a dead launcher left running (its workers, schedule process and API, which
    nothing supervises any more and which would clash with the new ones). Says what it did."""
    said = check_node_free(settings)
    ended, stale = groups.end_recorded(settings.home_path, settings.node)
    if ended:
        said.append(f"ended {ended} processes a dead launcher had left running "
                    f"(recorded in {groups.groups_file(settings.home_path, settings.node)})")
    if stale:
        said.append(f"ignored {stale} stale process records (now other processes)")
    clash = ports.clash(settings.api_host, settings.api_port)
    if clash:
        raise StackError(clash)
    return said


def up_detached(settings: Settings, specs: list[WorkerSpec],
                timeout: float = UP_TIMEOUT_SECONDS) -> list[str]:
    """Start the launcher in the background; return once every worker answers, with the
    refusals of those that refused their device. StackError when every one refused: a node
    with no worker runs nothing."""
    logs = settings.home_path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    since = utcnow()
    with open(logs / "launcher.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker", "--node", settings.node,
                                 "--with-schedule"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    names = [s.name for s in specs]
    deadline = time.monotonic() + timeout
    while (alive_since(settings.database, names, since, settings.heartbeat_ttl)
           | set(refused_since(settings.database, names, since))) != set(names):
        if proc.poll() is not None:
            raise StackError(f"the worker launcher exited with {proc.returncode}; "
                             f"see {logs / 'launcher.log'}")
        if time.monotonic() > deadline:
            raise StackError(f"workers did not all answer within {timeout:.0f}s; "
                             f"see the logs in {logs}")
        time.sleep(0.25)
    refused = refused_since(settings.database, names, since)
    refusals = [f"{name}: {why}" for name, why in sorted(refused.items())]
    if len(refusals) == len(names):
        raise StackError(f"no worker of node {settings.node} started: {'; '.join(refusals)}; the "
                         "schedule process and the API are up (`mxq down` stops them)")
    return refusals


def _stop_launchers(launchers: list[procs.Proc]) -> None:
    """SIGTERM each, then wait until each process is gone, not only its record (a launcher
    removes that before Python exits)."""
    for launcher in launchers:
        os.kill(launcher.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS + 10
    while any(procs.matches(p) for p in launchers) and time.monotonic() < deadline:
        time.sleep(0.1)


def down(settings: Settings) -> tuple[list[str], list[str]]:
    """Stop every launcher of this home (and so their workers), what a dead launcher of this
    node left running, and the embedded broker: what was stopped, and notes on stale records
    that were left alone."""
    launchers, notes = live_launchers(settings)
    _stop_launchers(launchers)
    stopped = [f"workers (launcher pid {p.pid})" for p in launchers]
    strays, stale = groups.end_recorded(settings.home_path, settings.node)  # outlived the launcher
    if strays:
        stopped.append(f"{strays} processes the workers had left behind")
    if stale:
        notes.append(f"ignored {stale} stale process records (now other processes)")
    redis = EmbeddedRedis(settings.home_path)
    if settings.embedded_broker and redis.running():
        problem = redis.stop()
        if problem:
            notes.append(problem)
        else:
            stopped.append(f"embedded Redis ({redis.socket})")
    return stopped, notes
