"""The device table: heartbeats and queue counts from SQL, device leases from Redis.

A device queue with queued jobs but no worker (jobs sent with `--allow-offline` to a device that
never started, or whose worker row is gone) gets a row of its own, `offline: true`, so that work
waiting for nobody shows in `mxq devices`, the API and `/metrics`. Every row says how long its
oldest queued job has waited (`oldest_wait_seconds`), and its device's `health` ("healthy",
"out": its worker refused it, with `out_reason` and `out_since`, or "offline":
`mxq.db.fleet.health`). A GPU worker's heartbeat reads its GPU through NVML: its row's `nvml` says
what it read (`health`, `reason`, ECC, row remaps, clock event reasons, Xids), and its memory
figures are NVML's live ones instead of nvidia-smi's when the worker was planned."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import redis

from mxq.db.fleet import health
from mxq.db.reports.history import device_rates, device_records, oldest_queued
from mxq.db.schema import utcnow
from mxq.json_types import JsonObject
from mxq.workers.broker.queues import worker_name
from mxq.workers.fleet import leases
from mxq.workers.settings import Settings

RATE_WINDOW = timedelta(minutes=5)  # a device's samples/s is averaged over this recent stretch
# A device's own queue, `<node>.<kind>.<index>` (workers/broker/queues.device_queue); node names hold
# no dot (settings: MXQ_NODE), so pool and control queues never match.
DEVICE_QUEUE = re.compile(r"^(?P<node>[^.]+)\.(?P<kind>cpu|gpu)\.(?P<index>\d+)$")


def device_table(s: Settings) -> list[JsonObject]:
    """One record per device worker, with `leased_by` (the job holding it, else None), then one
    per device queue that has queued jobs and no worker (`offline_rows`)."""
    records = device_records(s.database, s.heartbeat_ttl)
    held: dict[tuple[str, str], int | None] = {}
    try:
        held = leases.held(s.broker, [(r["node"], r["device"]) for r in records])
    except (redis.RedisError, OSError):
        pass  # the broker is down: the table still shows what SQL knows
    rates = device_rates(s.database, utcnow() - RATE_WINDOW)
    waiting = oldest_queued(s.database)
    now = utcnow()
    rows: list[JsonObject] = [{**r, "leased_by": held.get((r["node"], r["device"])),
             "samples_per_sec": rates.get((r["node"], r["device"])), "offline": False,
             "oldest_wait_seconds": _age(waiting.get(r["queue"]), now),
             **_health(r), **_live_memory(r)} for r in records]
    return rows + offline_rows(waiting, {r["queue"] for r in records}, now)


def _health(record: JsonObject) -> JsonObject:
    """`health`, `out_reason`, `out_since` of a device record (its worker's info, `refused` and
    `refused_at`, is spread into it)."""
    state, reason, since = health(bool(record["alive"]), record)
    return {"health": state, "out_reason": reason, "out_since": since}


def _live_memory(record: JsonObject) -> JsonObject:
    """`memory_used_mib` and `memory_total_mib` as NVML read them at the worker's last stored
    beat, where it did (else nothing: nvidia-smi's figures at planning stay)."""
    read = record.get("nvml")
    if not isinstance(read, dict) or read.get("memory_used_mib") is None:
        return {}
    return {"memory_used_mib": read["memory_used_mib"], "memory_total_mib": read.get("memory_total_mib")}


def _age(entry: tuple[int, datetime] | None, now: datetime) -> float | None:
    return None if entry is None else round(max(0.0, (now - entry[1]).total_seconds()), 1)


def offline_rows(waiting: dict[str, tuple[int, datetime]], served: set[str],
                 now: datetime) -> list[JsonObject]:
    """A row for each device queue holding queued jobs that no known worker serves: the jobs
    would otherwise wait unseen until a worker for that device starts."""
    rows: list[JsonObject] = []
    for queue, entry in sorted(waiting.items()):
        match = DEVICE_QUEUE.match(queue)
        if queue in served or match is None:
            continue
        node, kind, index = match["node"], match["kind"], int(match["index"])
        rows.append({
            "device": f"{kind}:{index}", "node": node, "queue": queue,
            "worker": worker_name(node, kind, index), "alive": False, "offline": True,
            "queued": entry[0], "running": 0, "current_job": None, "last_heartbeat": None,
            "heartbeat_age": None, "pid": None, "started_at": None, "leased_by": None,
            "samples_per_sec": None, "oldest_wait_seconds": _age(entry, now), "engines": [],
            "health": "offline", "out_reason": None, "out_since": None,
        })
    return rows
