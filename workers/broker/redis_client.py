"""Plain Redis clients of the broker, for what mxq reads and writes there beside Celery: leases,
job messages, dead letters, the broker's health.

mxq's broker URLs come in two forms: `redis://…` (redis-py reads it) and the embedded broker's
`redis+socket://PATH` (a scheme only mxq writes, so redis-py is handed the socket's path).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypedDict, Unpack

import redis
from redis.retry import Retry

SOCKET_SCHEME = "redis+socket://"


class Options(TypedDict, total=False):
    """The redis-py options mxq sets on a client of its own."""

    socket_connect_timeout: float
    socket_timeout: float
    retry: Retry
    decode_responses: bool


def connect(broker: str, **options: Unpack[Options]) -> redis.Redis:
    """A new Redis client for the broker URL, with redis-py's `options` (timeouts, retries…)."""
    if broker.startswith(SOCKET_SCHEME):
        return redis.Redis(unix_socket_path=broker.removeprefix(SOCKET_SCHEME), **options)
    return redis.Redis.from_url(broker, **options)


@lru_cache(maxsize=4)
def client(broker: str) -> redis.Redis:
    """The process's shared client for the broker URL: replies decoded to text, and a broker
    that does not accept a connection within 3 s is an error, not a hang."""
    return connect(broker, socket_connect_timeout=3, decode_responses=True)
