"""The dead-letter list: broker messages no worker can read, moved aside instead of crashing it.

A message that is not JSON, a bare number, an envelope without properties, or a body whose
`body_encoding` does not decode once made every worker of a queue exit, again after each restart.
Whoever meets one (a worker's transport, `mxq.workers.broker.transport`; the reconciler, sweeping the
queues) stores it here with the queue it sat in and why it cannot be read. `mxq dead-letters`
shows the list and clears it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TypedDict

import redis

KEY = "mxq.dead-letters"
MAX_KEPT = 1000  # the newest are kept
MAX_RAW_CHARS = 4096  # of each message, as text

log = logging.getLogger(__name__)


class DeadLetter(TypedDict):
    """One dead letter as stored: its queue, when it was moved, why, and the message as text
    (cut at MAX_RAW_CHARS; `chars` is its whole length)."""

    queue: str
    at: str
    reason: str
    message: str
    chars: int


def entry(queue: str, raw: object, reason: str) -> str:
    """One dead letter as stored: where, when, why, and the message as text (cut)."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace") if isinstance(raw, bytes) \
        else json.dumps(raw, default=str)
    letter: DeadLetter = {"queue": queue, "at": datetime.now(UTC).isoformat(), "reason": reason[:300],
                          "message": text[:MAX_RAW_CHARS], "chars": len(text)}
    return json.dumps(letter)


def store(client: redis.Redis, queue: str, raw: object, reason: str) -> None:
    """Keep a message no one can read (newest first, at most MAX_KEPT), and log it."""
    log.error("moved an unreadable message of %s to %s: %s", queue, KEY, reason)
    pipe = client.pipeline()
    pipe.lpush(KEY, entry(queue, raw, reason))
    pipe.ltrim(KEY, 0, MAX_KEPT - 1)
    pipe.execute()


def listed(client: redis.Redis) -> list[DeadLetter]:
    """The dead letters, newest first."""
    return [json.loads(item) for item in client.lrange(KEY, 0, -1)]


def clear(client: redis.Redis) -> int:
    """Drop every dead letter; how many there were."""
    pipe = client.pipeline(transaction=True)
    pipe.llen(KEY)
    pipe.delete(KEY)
    count, _ = pipe.execute()
    return int(count)
