"""The broker's settings: MXQ_BROKER_URL (Redis over TCP or TLS; unset: the embedded Redis on a
unix socket), how long Redis keeps a message unacknowledged, and how long a submit waits for it."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator

from mxq.workers.settings.part import DAY, Part, check_url

# Long enough for the longest training job: Redis hands an unacknowledged message to another
# worker after this many seconds, so a shorter value would run long jobs twice.
DEFAULT_VISIBILITY_TIMEOUT = 12 * 3600
# A user's submit waits this long for each broker call (the reachability check, the publish): a
# hung Redis (paused, a frozen VM) must not hang `mxq infer` or `POST /api/v1/jobs`. A job whose
# message is not out by then stays queued and the reconciler publishes it.
DEFAULT_BROKER_TIMEOUT_SECONDS = 5.0
# The URL schemes mxq runs with for the broker: Redis over TCP, TLS or the embedded unix socket.
BROKER_SCHEMES = ("redis", "rediss", "redis+socket")
# Linux's sun_path holds 108 bytes with the closing NUL: a longer socket path is cut short.
MAX_SOCKET_PATH = 107
FALLBACK_SOCKET_ROOT = "/tmp"  # the last short folder tried for the socket


class BrokerFields(Part):
    broker_url: str | None = Field(None, description="Redis URL; unset = embedded Redis.")
    visibility_timeout: int = Field(DEFAULT_VISIBILITY_TIMEOUT, ge=60, le=int(30 * DAY))
    broker_timeout_seconds: float = Field(
        DEFAULT_BROKER_TIMEOUT_SECONDS, gt=0, le=300,
        description="Longest a submit waits for each broker call; past it the job stays queued, "
        "the answer says it is not published yet, and the reconciler publishes it.")

    @field_validator("broker_url")
    @classmethod
    def _broker_scheme(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, "MXQ_BROKER_URL", BROKER_SCHEMES,
                                                    "redis://HOST:6379/0; unset it for the "
                                                    "embedded Redis")


@dataclass(frozen=True)
class BrokerSettings:
    """The broker a process reaches (`Settings.broker_settings`): its URL (the embedded Redis's
    socket when MXQ_BROKER_URL is unset) and its timeouts."""

    url: str
    embedded: bool
    visibility_timeout: int
    timeout_seconds: float


def redis_socket_path(home: Path) -> Path:
    """Where the embedded Redis of `home` listens: `home/redis.sock` when that fits sun_path
    (107 bytes), else `redis.sock` in a folder named by a hash of the home under
    $XDG_RUNTIME_DIR or the temp folder (one per home, the same for every process). Every
    process that reaches the embedded Redis asks here. Where nothing fits, the shortest (too
    long) path: Settings refuses such a home in one line before anything starts."""
    home = home.expanduser().resolve()
    own = home / "redis.sock"
    if len(os.fsencode(own)) <= MAX_SOCKET_PATH:
        return own
    name = "mxq-" + hashlib.sha256(os.fsencode(home)).hexdigest()[:16]
    roots = (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), FALLBACK_SOCKET_ROOT)
    shorts = [Path(r) / name / "redis.sock" for r in roots if r and Path(r).is_absolute()]
    fitting = [p for p in shorts if len(os.fsencode(p)) <= MAX_SOCKET_PATH]
    return fitting[0] if fitting else min([own, *shorts], key=lambda p: len(os.fsencode(p)))
