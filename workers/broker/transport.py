"""kombu's Redis transport, made to survive whatever a queue holds.

kombu turns each raw queue item into a message before Celery sees it; an item that is not JSON,
that is not an envelope (a bare number), or whose body does not decode by its `body_encoding`
raises there, inside the worker's event loop, and the worker exits ("Unrecoverable error"). Here
such an item goes to the dead-letter list (`mxq.workers.broker.deadletters`) and the worker goes on.

Celery uses this transport for every broker URL mxq builds (`transport_url`: `redis://…` becomes
`mxq://…`, the embedded `redis+socket://…` becomes `mxq+socket://…`), registered under the alias
`mxq` (kombu's TRANSPORT_ALIASES, its way of naming transports).
"""

from __future__ import annotations

from collections.abc import Callable

from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from mxq.workers.broker import deadletters
from mxq.workers.broker.messages import unreadable

ALIAS = "mxq"
# What redis-py makes of a BRPOP reply: (the list's key, the item), or None when none came.
BrpopReply = tuple[bytes, bytes] | None
TRANSPORT_ALIASES[ALIAS] = "mxq.workers.broker.transport:Transport"


def transport_url(broker: str) -> str:
    """The broker URL with this transport's scheme (other schemes are left as they are)."""
    for scheme in ("redis+socket://", "redis://"):
        if broker.startswith(scheme):
            return ALIAS + broker[len("redis"):]
    return broker


class Unreadable(Exception):
    """A queue item kombu cannot turn into a message; the text says why."""


class Message(virtual.Message):
    """kombu's message, built only from an item kombu can read: else `Unreadable` says why."""

    def __init__(self, payload: object, channel: object = None, **kwargs: object) -> None:
        reason = unreadable(payload)
        if reason is None:
            try:
                super().__init__(payload, channel=channel, **kwargs)
                return
            except Exception as exc:  # whatever kombu raises on it
                reason = f"kombu cannot read it: {type(exc).__name__}: {exc}"
        raise Unreadable(reason)


class Channel(kombu_redis.Channel):
    """kombu's channel, with what it cannot read moved aside at the two places it reads items.

    Neither copies kombu's code: a BRPOP reply is checked by a redis-py response callback on the
    client kombu reads it with (redis-py's public hook), and a message is built by `Message`,
    which raises `Unreadable`, caught around the per-queue callback kombu's `basic_consume`
    installs. What they rely on in kombu is recorded in `kombu_mirror`."""

    Message = Message

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        parse = self.client.response_callbacks.get("BRPOP", lambda reply, **_: reply)
        self.client.set_response_callback(
            "BRPOP", lambda reply, **options: self._readable(parse(reply, **options)))

    def _readable(self, reply: BrpopReply) -> BrpopReply:
        """A BRPOP reply `(list, item)` whose item is JSON, else None (kombu's "nothing came"),
        the item moved to the dead-letter list."""
        if not reply:
            return reply
        name, item = reply
        try:
            loads(bytes_to_str(item))
        except ValueError as exc:
            queue = bytes_to_str(name).removeprefix(self.global_keyprefix or "").rsplit(self.sep, 1)[0]
            self._dead_letter(queue, item, f"not JSON: {exc}")
            return None
        return reply

    def _dead_letter(self, queue: str, raw: object, reason: str) -> None:
        with self.conn_or_acquire() as client:
            deadletters.store(client, queue, raw, reason)

    def basic_consume(self, queue: str, no_ack: bool, callback: Callable[[object], object], consumer_tag: str,
                      **kwargs: object) -> None:
        """kombu's consumer, whose callback for `queue` moves an item it cannot read aside."""
        super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        deliver = self.connection._callbacks[queue]

        def guarded(raw_message: object) -> object:
            try:
                return deliver(raw_message)
            except Unreadable as exc:
                self._dead_letter(queue, raw_message, str(exc))
                return None

        self.connection._callbacks[queue] = guarded


class Transport(kombu_redis.Transport):
    Channel = Channel
