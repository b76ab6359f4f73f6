"""Is the broker reachable? The health check (`GET /api/v1/devices`) and `/metrics` ask, so a
dead broker shows as a 503 and `mxq_broker_up 0`, not as idle devices with empty queues. (The
database needs no probe of its own: every health answer reads it, and a failed read is a 503.)"""

from __future__ import annotations

from functools import lru_cache

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mxq.errors import first_line
from mxq.workers.broker.redis_client import connect
from mxq.workers.settings import Settings
from mxq.workers.stack_record import without_password

# A broker that does not answer a PING this fast is reported down: a paused Redis must not hang
# the health check that is meant to notice it.
HEALTH_TIMEOUT_SECONDS = 2.0


@lru_cache(maxsize=4)
def _client(broker: str) -> redis.Redis:
    timeout = HEALTH_TIMEOUT_SECONDS
    return connect(broker, socket_connect_timeout=timeout, socket_timeout=timeout,
                   retry=Retry(NoBackoff(), 0))


def broker_problem(s: Settings) -> str | None:
    """One line saying why the broker cannot be reached, or None when it answers."""
    try:
        _client(s.broker).ping()
        return None
    except (redis.RedisError, OSError) as exc:
        return f"broker unreachable at {without_password(s.broker)[0]}: {first_line(exc)}"
