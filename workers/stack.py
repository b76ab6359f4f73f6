"""`mxq up` / `mxq down`: the embedded broker, the schema, and this node's worker launcher."""

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
from mxq.workers import groups
from mxq.workers.devices import discover, installed_mxnet
from mxq.workers.embedded import EmbeddedRedis
from mxq.workers.launcher import STOP_GRACE_SECONDS, Launcher, WorkerSpec, api_spec, plan, schedule_spec
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
                       settings.expect_gpus)
    return plan(settings, devices, settings.mxnet_build or installed_mxnet())


def run_launcher(settings: Settings, specs: list[WorkerSpec], with_schedule: bool = False) -> int:
    """Supervise this node's workers in the foreground until SIGTERM or Ctrl-C."""
    pidfile = launcher_pidfile(settings)
    pidfile.write_text(str(os.getpid()))
    try:
        services = [schedule_spec(settings), api_spec(settings)] if with_schedule else []
        return Launcher(settings, [*specs, *services]).run()
    finally:
        pidfile.unlink(missing_ok=True)


def launcher_pid(settings: Settings) -> int | None:
    try:
        pid = int(launcher_pidfile(settings).read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None


def up_detached(settings: Settings, specs: list[WorkerSpec],
                timeout: float = UP_TIMEOUT_SECONDS) -> None:
    """Start the launcher in the background; return once every worker answers."""
    if launcher_pid(settings):
        raise StackError(f"mxq is already up (launcher pid {launcher_pid(settings)}); "
                         "`mxq down` stops it")
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
           | refused_since(settings.database, names, since)) != set(names):
        if proc.poll() is not None:
            raise StackError(f"the worker launcher exited with {proc.returncode}; "
                             f"see {logs / 'launcher.log'}")
        if time.monotonic() > deadline:
            raise StackError(f"workers did not all answer within {timeout:.0f}s; "
                             f"see the logs in {logs}")
        time.sleep(0.25)


def down(settings: Settings) -> list[str]:
    """Stop the launcher (and so its workers) and the embedded broker; say what was stopped."""
    stopped = []
    pid = launcher_pid(settings)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 10
        # Until the process is gone, not only its pidfile: it removes that before Python exits.
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped.append(f"workers (launcher pid {pid})")
    strays = groups.end_recorded(settings.home_path, settings.node)  # what outlived its parent
    if strays:
        stopped.append(f"{strays} processes the workers had left behind")
    redis = EmbeddedRedis(settings.home_path)
    if settings.embedded_broker and redis.running():
        redis.stop()
        stopped.append(f"embedded Redis ({redis.socket})")
    return stopped


def _alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (exited, waiting for its parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): the signal reached it
