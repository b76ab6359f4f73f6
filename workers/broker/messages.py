"""Job messages as kombu keeps them in Redis: which jobs have one waiting or held, and dropping
the waiting messages of jobs that another worker already took (dynamic batching).

Kombu keeps a queue's messages of priority p > 0 in "<queue>\\x06\\x16<p>", and delivered,
unacknowledged ones in the "unacked" hash, with their delivery time in the "unacked_index"
sorted set. A message's task id is `job-<id>` (workers.submit). These names, and the text kombu
writes a task id as, are read from kombu itself below; what else this module assumes of kombu is
recorded in `kombu_mirror`, which the tests compare with the installed kombu.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field

from kombu.transport.redis import Channel as KombuChannel
from kombu.utils.json import dumps as kombu_dumps

from mxq.workers.broker import deadletters, redis_client
from mxq.workers.broker.queues import PRIORITY_STEPS

# kombu's own names (its Redis channel's defaults, which mxq's transport does not override), and
# mxq's priority steps (which it does).
PRIORITY_SEP = str(KombuChannel.sep)
STEPS_ABOVE_0 = tuple(p for p in PRIORITY_STEPS if p)  # priority 0: the queue itself
UNACKED, UNACKED_INDEX = str(KombuChannel.unacked_key), str(KombuChannel.unacked_index_key)
# How a task id starts in a stored message, as kombu's JSON writes it (`"id": "job-`): the
# separators are kombu's, so the mark is written by kombu rather than copied here.
JOB_ID_MARK = str(kombu_dumps({"id": "job-"}))[1:-2]  # type: ignore[no-untyped-call]  # kombu has no types

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
            for suffix in ("", *(f"{PRIORITY_SEP}{p}" for p in STEPS_ABOVE_0))]


def unreadable(message: object) -> str | None:
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
    return _job_of(message)


def _job_of(message: dict[str, object]) -> int | None:
    """The job id in a readable envelope's task id (`job-<id>`), else None."""
    headers = message.get("headers") or {}
    task_id = str(headers.get("id", "")) if isinstance(headers, dict) else ""
    return int(task_id[4:]) if task_id.startswith("job-") and task_id[4:].isdigit() else None


@dataclass(frozen=True)
class Held:
    """A delivered, unacknowledged message of a job."""

    tag: str
    age: float  # seconds since its delivery


@dataclass
class Look:
    """What one look at the broker saw: job ids waiting in the queues, jobs delivered but not
    acknowledged, and the queue items no consumer can read ((Redis list, item, why))."""

    waiting: set[int] = field(default_factory=set)
    held: dict[int, list[Held]] = field(default_factory=dict)
    unreadable: list[tuple[str, str, str]] = field(default_factory=list)


# Queue items read per script call: a look at 100,000 queued messages is many short calls, never
# one that blocks Redis (and every worker's delivery and ack) while it reads the whole queue.
PAGE = 5_000

# The job ids of one page of a queue (KEYS[1], items ARGV[1]..ARGV[2]), read inside Redis: a
# message's task id is in its headers as `"id": "job-N"` (ARGV[3], JOB_ID_MARK: kombu's JSON
# separators), found by plain search (a page of 5,000 takes Redis a few milliseconds). Items with
# no such id, or more than one, come back whole, for `_read` to judge. Returns the ids joined by
# commas, then those items: only ids cross the network, not the whole queue.
_PAGE_IDS = """
local ids, others, mark = {}, {}, ARGV[3]
for _, raw in ipairs(redis.call('lrange', KEYS[1], ARGV[1], ARGV[2])) do
  local at = string.find(raw, mark, 1, true)
  local id = at and string.match(raw, '^(%d+)"', at + #mark)
  if id and not string.find(raw, mark, at + #mark, true) then
    ids[#ids + 1] = id
  else
    others[#others + 1] = raw
  end
end
return {table.concat(ids, ','), others}
"""


def _read(raw: str) -> tuple[int | None, str | None]:
    """A queue item's job id (None for a readable message of another task) or why it cannot be
    read."""
    try:
        message = json.loads(raw)
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    if (reason := unreadable(message)) is not None:
        return None, reason
    return _job_of(message), None


def look(broker: str, queues: set[str]) -> Look:
    """Read `queues` and the unacked set once.

    Each queue is read head first, a page at a time, and the unacked set after every queue. A
    worker takes a message from a queue's tail into the unacked set, read last, so a message
    moving meanwhile is still seen (except for the instant it is in neither, which a second look
    covers); one published meanwhile may be read twice, which is harmless.
    """
    client = redis_client.client(broker)
    names = stored_names(queues)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.llen(name)
    seen, page_ids = Look(), client.register_script(_PAGE_IDS)
    for name, length in zip(names, pipe.execute(), strict=True):
        for start in range(0, int(length), PAGE):  # (a list grown meanwhile: its head is newer)
            ids, others = page_ids(keys=[name], args=[start, start + PAGE - 1, JOB_ID_MARK])
            seen.waiting.update(int(i) for i in str(ids).split(",") if i)
            for raw in map(str, others):
                found, reason = _read(raw)
                if found is not None:
                    seen.waiting.add(found)
                elif reason is not None:
                    seen.unreadable.append((name, raw, reason))
    pipe = client.pipeline(transaction=True)
    pipe.hgetall(UNACKED)
    pipe.zrange(UNACKED_INDEX, 0, -1, withscores=True)
    pipe.time()
    unacked, delivered, (secs, micros) = pipe.execute()
    now, since = secs + micros / 1e6, dict(delivered)
    for tag, raw in unacked.items():
        if (found := job_id(raw)) is not None:
            seen.held.setdefault(found, []).append(Held(tag, now - since.get(tag, now)))
    return seen


def in_broker(broker: str, queues: set[str]) -> tuple[set[int], dict[int, list[Held]]]:
    """Job ids with a message waiting in one of `queues`, and those delivered but unacked."""
    seen = look(broker, queues)
    return seen.waiting, seen.held


def drop_waiting(broker: str, queues: list[str], job_ids: list[int]) -> int:
    """Remove the waiting messages of `job_ids` from `queues`; returns how many went.

    Only for jobs already claimed in SQL: should their worker die, the reconciler requeues
    them as for any running job whose message is gone.
    """
    if not job_ids:
        return 0
    names = stored_names(queues)
    return int(redis_client.client(broker).eval(_DROP, len(names), *names, *(f"job-{i}" for i in job_ids)))


def move_aside(broker: str, items: list[tuple[str, str, str]]) -> list[str]:
    """Move unreadable queue items (as `look` found them) to the dead-letter list; the queue of
    each one moved.

    A poison item no worker takes (its queue's worker is gone, or it sits behind a queued job)
    would otherwise stay, and each look at the queue would meet it again."""
    client = redis_client.client(broker)
    moved = []
    for name, raw, reason in items:
        if client.lrem(name, 1, raw):
            deadletters.store(client, name, raw, reason)
            moved.append(name)
    return moved
