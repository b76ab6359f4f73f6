"""Job messages as kombu keeps them in Redis: which jobs have one waiting or held, and dropping
the waiting messages of jobs that another worker already took (dynamic batching).

Kombu keeps a queue's messages of priority p > 0 in "<queue>\\x06\\x16<p>", and delivered,
unacknowledged ones in the "unacked" hash, with their delivery time in the "unacked_index"
sorted set. A message's task id is `job-<id>` (workers.submit).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from mxq.workers import deadletters, leases

PRIORITY_SEP, PRIORITY_STEPS = "\x06\x16", (3, 6, 9)
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"

# Remove from the lists in KEYS every message whose task id is one of ARGV; returns how many.
# Runs as one script, so a worker never pops a message while it is being looked at.
_DROP = """
local wanted = {}
for _, id in ipairs(ARGV) do wanted[id] = true end
local dropped = 0
for _, name in ipairs(KEYS) do
  for _, raw in ipairs(redis.call('lrange', name, 0, -1)) do
    local ok, message = pcall(cjson.decode, raw)
    if ok and type(message) == 'table' and type(message.headers) == 'table'
        and wanted[tostring(message.headers.id)] then
      dropped = dropped + redis.call('lrem', name, 1, raw)
    end
  end
end
return dropped
"""


def stored_names(queues: set[str] | list[str]) -> list[str]:
    """The Redis lists that hold the messages of `queues`, every priority included."""
    return [q + suffix for q in sorted(queues)
            for suffix in ("", *(f"{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS))]


def unreadable(message: Any) -> str | None:
    """Why a queue item (parsed from JSON) is not a message kombu can read, else None."""
    if not isinstance(message, dict):
        return f"not a message envelope but a JSON {type(message).__name__}"
    props = message.get("properties")
    if not isinstance(props, dict) or "delivery_tag" not in props:
        return "its envelope has no properties with a delivery_tag"
    if not isinstance(message.get("headers") or {}, dict):
        return "its headers are not an object"
    body, encoding = message.get("body"), props.get("body_encoding")
    if body and encoding is not None:
        if encoding != "base64":
            return f"its body_encoding {encoding!r} is not one kombu knows (base64)"
        try:
            base64.b64decode(str(body).encode(), validate=True)
        except (binascii.Error, ValueError):
            return "its body is not base64, although its body_encoding says so"
    return None


def job_id(raw: str) -> int | None:
    """The job id of one stored kombu message (None for anything else, however malformed)."""
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if isinstance(message, list):  # an unacked entry: [message, exchange, routing key]
        message = message[0] if message else {}
    if not isinstance(message, dict) or not isinstance(message.get("headers") or {}, dict):
        return None
    task_id = str((message.get("headers") or {}).get("id", ""))
    return int(task_id[4:]) if task_id.startswith("job-") and task_id[4:].isdigit() else None


@dataclass(frozen=True)
class Held:
    """A delivered, unacknowledged message of a job."""

    tag: str
    age: float  # seconds since its delivery


def in_broker(broker: str, queues: set[str]) -> tuple[set[int], dict[int, list[Held]]]:
    """Job ids with a message waiting in one of `queues`, and those delivered but unacked.

    Read in one MULTI, so a message moving between a queue and the unacked set is seen once.
    """
    pipe = leases.client(broker).pipeline(transaction=True)
    for name in stored_names(queues):
        pipe.lrange(name, 0, -1)
    pipe.hgetall(UNACKED)
    pipe.zrange(UNACKED_INDEX, 0, -1, withscores=True)
    pipe.time()
    *waiting, unacked, delivered, (secs, micros) = pipe.execute()
    now, since = secs + micros / 1e6, dict(delivered)
    held: dict[int, list[Held]] = {}
    for tag, raw in unacked.items():
        if (found := job_id(raw)) is not None:
            held.setdefault(found, []).append(Held(tag, now - since.get(tag, now)))
    queued = {found for lst in waiting for raw in lst if (found := job_id(raw)) is not None}
    return queued, held


def drop_waiting(broker: str, queues: list[str], job_ids: list[int]) -> int:
    """Remove the waiting messages of `job_ids` from `queues`; returns how many went.

    Only for jobs already claimed in SQL: should their worker die, the reconciler requeues
    them as for any running job whose message is gone.
    """
    if not job_ids:
        return 0
    names = stored_names(queues)
    return int(leases.client(broker).eval(_DROP, len(names), *names, *(f"job-{i}" for i in job_ids)))


def sweep(broker: str, queues: set[str]) -> list[str]:
    """Move the unreadable items of `queues` to the dead-letter list; the queue of each one moved.

    A poison item no worker takes (its queue's worker is gone, or it sits behind a queued job)
    would otherwise stay, and each look at the queue would meet it again."""
    client = leases.client(broker)
    moved = []
    for name in stored_names(queues):
        for raw in map(str, client.lrange(name, 0, -1)):  # (the client decodes responses)
            try:
                reason = unreadable(json.loads(raw))
            except ValueError as exc:
                reason = f"not JSON: {exc}"
            if reason is not None and client.lrem(name, 1, raw):
                deadletters.store(client, name, raw, reason)
                moved.append(name)
    return moved
