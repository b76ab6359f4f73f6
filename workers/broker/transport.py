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

from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from mxq.workers.broker import deadletters
from mxq.workers.broker.messages import unreadable

ALIAS = "mxq"
TRANSPORT_ALIASES[ALIAS] = "mxq.workers.broker.transport:Transport"


def transport_url(broker: str) -> str:
    """The broker URL with this transport's scheme (other schemes are left as they are)."""
    for scheme in ("redis+socket://", "redis://"):
        if broker.startswith(scheme):
            return ALIAS + broker[len("redis"):]
    return broker


class Channel(kombu_redis.Channel):  # (kombu has no types)
    def _dead_letter(self, queue: str, raw: Any, reason: str) -> None:
        with self.conn_or_acquire() as client:
            deadletters.store(client, queue, raw, reason)

    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: str,
                      **kwargs: Any) -> None:
        """kombu's consumer, with the step that builds a message from a raw item guarded."""
        super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

        def _callback(raw_message: Any) -> Any:
            reason = unreadable(raw_message)
            if reason is None:
                try:
                    message = self.Message(raw_message, channel=self)
                except Exception as exc:  # noqa: BLE001  # whatever kombu raises on it
                    reason = f"kombu cannot read it: {type(exc).__name__}: {exc}"
            if reason is not None:
                self._dead_letter(queue, raw_message, reason)
                return None
            if not no_ack:
                self.qos.append(message, message.delivery_tag)
            return callback(message)

        self.connection._callbacks[queue] = _callback

    def _brpop_read(self, **options: Any) -> bool:
        """kombu 5.7's BRPOP reader (pinned in pyproject.toml), with an item that is not JSON
        moved aside, not raised."""
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            try:
                payload = loads(bytes_to_str(item))
            except ValueError as exc:
                self._dead_letter(dest, item, f"not JSON: {exc}")
                return True
            self.connection._deliver(payload, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # (as kombu does)
            self._flush_brpop_reauth()


class Transport(kombu_redis.Transport):
    Channel = Channel
