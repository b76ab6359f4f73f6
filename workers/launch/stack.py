"""`mxq up` / `mxq down`: the embedded broker, the schema, and this node's worker launcher.

Every process is recognised by its identity (`workers/launch/procs.py`), never by a PID alone: a
`launcher.pid` naming another process is stale, removed with a word, and never signalled. A
launcher that died leaves its children running; `mxq up` (`preflight`) and `mxq down` end them.
"""

from __future__ import annotations

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
from mxq.workers.hardware.devices import discover, installed_mxnet
from mxq.workers.launch import groups, ports, procs
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.launch.launcher import (
    STOP_GRACE_SECONDS,
    Launcher,
    WorkerSpec,
    api_spec,
    plan,
    schedule_spec,
)
from mxq.workers.settings import Settings, record_stack

log = logging.getLogger(__name__)
UP_TIMEOUT_SECONDS = 180.0


class StackError(Unavailable):
    """The stack could not be brought up or down; the message says what to look at."""


def launcher_pidfile(settings: Settings) -> Path:
    return settings.home_path / "launcher.pid"


def prepare(settings: Settings) -> bool:
    """Home folder, embedded broker (when no broker URL is set) and schema; True if Redis started."""
    settings.home_path.mkdir(parents=True, exist_ok=True)
    record_stack(settings)
    started = EmbeddedRedis(settings.home_path).start() if settings.embedded_broker else False
    upgrade(settings.database)
    return started


def node_plan(settings: Settings) -> tuple[list[WorkerSpec], list[str]]:
    devices = discover(settings.nvidia_smi, settings.cpu_devices, settings.host_gpu_ids,
                       settings.expect_gpus, settings.cuda_visible_devices)
    return plan(settings, devices, settings.mxnet_build or installed_mxnet())


def run_launcher(settings: Settings, specs: list[WorkerSpec], with_schedule: bool = False) -> int:
    """Supervise this node's workers in the foreground until SIGTERM or Ctrl-C."""
    pidfile = launcher_pidfile(settings)
    me = procs.me()
    procs.write(pidfile, me)
    try:
        services = [schedule_spec(settings), api_spec(settings)] if with_schedule else []
        return Launcher(settings, [*specs, *services]).run()
    finally:
        if procs.read(pidfile) == me:  # not a newer launcher's record
            pidfile.unlink(missing_ok=True)


def launcher_record(settings: Settings) -> tuple[procs.Proc | None, str | None]:
    """The running launcher of this home, and a one-line note when `launcher.pid` was stale
    (it named no process, or another one: removed, never signalled)."""
    pidfile = launcher_pidfile(settings)
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


def launcher_pid(settings: Settings) -> int | None:
    found, _ = launcher_record(settings)
    return found.pid if found else None


def preflight(settings: Settings) -> list[str]:
    """Before `mxq up` starts anything: refuse when this stack is already up or the API port is
    taken; end what a dead launcher left running (its workers, schedule process and API, which
    nothing supervises any more and which would clash with the new ones). Says what it did."""
    running, note = launcher_record(settings)
    if running:
        raise StackError(f"mxq is already up (launcher {running.describe()}); `mxq down` stops it")
    said = [note] if note else []
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


def down(settings: Settings) -> tuple[list[str], list[str]]:
    """Stop the launcher (and so its workers), what a dead launcher left running, and the
    embedded broker: what was stopped, and notes on stale records that were left alone."""
    stopped: list[str] = []
    running, note = launcher_record(settings)
    notes = [note] if note else []
    if running:
        os.kill(running.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 10
        # Until the process is gone, not only its pidfile: it removes that before Python exits.
        while procs.matches(running) and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped.append(f"workers (launcher pid {running.pid})")
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
