"""How a webhook delivery is signed, and how a receiver checks it (the docs show the same
check: docs/webhooks.md).

The signature is HMAC-SHA256, keyed by the endpoint's secret, over `ID.TIMESTAMP.BODY`: the
delivery id (`X-Mxq-Delivery`), the Unix time of the attempt in seconds (`X-Mxq-Timestamp`), and
the request's body as sent, bytes for bytes, joined by dots. It is sent as `X-Mxq-Signature:
sha256=HEX`. Signing the id and the time with the body lets a receiver refuse a replay (an old
timestamp) and a body moved to another delivery.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

DELIVERY = "X-Mxq-Delivery"
TIMESTAMP = "X-Mxq-Timestamp"
SIGNATURE = "X-Mxq-Signature"
EVENT = "X-Mxq-Event"
TOLERANCE_SECONDS = 300  # what `verify` accepts between the timestamp and the receiver's clock


def body(delivery_id: str, event: str, created_at: str | None, data: dict[str, Any]) -> bytes:
    """The JSON a delivery POSTs: its id, event, when the event happened, and what it says."""
    return json.dumps({"id": delivery_id, "event": event, "created_at": created_at, "data": data},
                      sort_keys=True, separators=(",", ":")).encode()


def signature(secret: str, delivery_id: str, timestamp: int, raw: bytes) -> str:
    """`sha256=HEX`: HMAC-SHA256(secret, f"{id}.{timestamp}." + body)."""
    signed = f"{delivery_id}.{timestamp}.".encode() + raw
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def headers(secret: str, delivery_id: str, event: str, timestamp: int, raw: bytes) -> dict[str, str]:
    return {DELIVERY: delivery_id, TIMESTAMP: str(timestamp), EVENT: event,
            SIGNATURE: signature(secret, delivery_id, timestamp, raw),
            "Content-Type": "application/json", "User-Agent": "mxq-webhooks/1"}


def verify(secret: str, delivery_id: str, timestamp: str, raw: bytes, sent: str, now: float) -> bool:
    """A receiver's check: the signature matches (compared in constant time) and the timestamp
    is within TOLERANCE_SECONDS of `now`."""
    try:
        when = int(timestamp)
    except ValueError:
        return False
    expected = signature(secret, delivery_id, when, raw)
    return abs(now - when) <= TOLERANCE_SECONDS and hmac.compare_digest(expected, sent)
