"""The device table: heartbeats and queue counts from SQL, device leases from Redis."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import redis

from mxq.db.history import device_rates, device_records
from mxq.db.schema import utcnow
from mxq.workers import leases
from mxq.workers.settings import Settings

RATE_WINDOW = timedelta(minutes=5)  # a device's samples/s is averaged over this recent stretch


def device_table(s: Settings) -> list[dict[str, Any]]:
    """One record per device worker, with `leased_by` (the job holding it, else None)."""
    records = device_records(s.database, s.heartbeat_ttl)
    held: dict[tuple[str, str], int | None] = {}
    try:
        held = leases.held(s.broker, [(r["node"], r["device"]) for r in records])
    except (redis.RedisError, OSError):
        pass  # the broker is down: the table still shows what SQL knows
    rates = device_rates(s.database, utcnow() - RATE_WINDOW)
    return [{**r, "leased_by": held.get((r["node"], r["device"])),
             "samples_per_sec": rates.get((r["node"], r["device"]))} for r in records]
