"""How a webhook delivery is signed, and how a receiver checks it (the docs show the same
check: docs/webhooks.md).

The signature is HMAC-SHA256, keyed by the endpoint's secret, over `ID.TIMESTAMP.BODY`: the
delivery id (`X-Mxq-Delivery`), the Unix time of the attempt in seconds (`X-Mxq-Timestamp`), and
the request's body as sent, bytes for bytes, joined by dots. It is sent as `X-Mxq-Signature:
sha256=HEX`. Signing the id and the time with the body lets a receiver refuse a replay (an old
timestamp) and a body moved to another delivery.

The same HMAC is also sent as the Standard Webhooks specification has it (standardwebhooks.com,
which svix and its libraries in every common language verify): `webhook-id`, `webhook-timestamp`
and `webhook-signature: v1,BASE64`. Its secret is the endpoint's secret in the specification's
form, `whsec_` and the base64 of the secret's bytes (`standard_secret`): every endpoint, old or
new, can be verified either way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from mxq.json_types import JsonMapping

DELIVERY = "X-Mxq-Delivery"
TIMESTAMP = "X-Mxq-Timestamp"
SIGNATURE = "X-Mxq-Signature"
EVENT = "X-Mxq-Event"
# The Standard Webhooks headers (the specification writes them in lower case).
STANDARD_ID, STANDARD_TIMESTAMP, STANDARD_SIGNATURE = "webhook-id", "webhook-timestamp", "webhook-signature"
STANDARD_PREFIX = "whsec_"
TOLERANCE_SECONDS = 300  # what `verify` accepts between the timestamp and the receiver's clock


def body(delivery_id: str, event: str, created_at: str | None, data: JsonMapping) -> bytes:
    """The JSON a delivery POSTs: its id, event, when the event happened, and what it says."""
    return json.dumps({"id": delivery_id, "event": event, "created_at": created_at, "data": data},
                      sort_keys=True, separators=(",", ":")).encode()


def _mac(secret: str, delivery_id: str, timestamp: int, raw: bytes) -> bytes:
    """HMAC-SHA256(secret, f"{id}.{timestamp}." + body): what both signatures carry."""
    return hmac.new(secret.encode(), f"{delivery_id}.{timestamp}.".encode() + raw, hashlib.sha256).digest()


def signature(secret: str, delivery_id: str, timestamp: int, raw: bytes) -> str:
    """`sha256=HEX` of the HMAC (`X-Mxq-Signature`)."""
    return "sha256=" + _mac(secret, delivery_id, timestamp, raw).hex()


def standard_signature(secret: str, delivery_id: str, timestamp: int, raw: bytes) -> str:
    """`v1,BASE64` of the same HMAC (`webhook-signature`, Standard Webhooks)."""
    return "v1," + base64.b64encode(_mac(secret, delivery_id, timestamp, raw)).decode()


def standard_secret(secret: str) -> str:
    """The endpoint's secret as Standard Webhooks libraries take it: `whsec_` + base64 of its
    bytes (so `Webhook(standard_secret(s))` verifies what `secret` signed)."""
    return STANDARD_PREFIX + base64.b64encode(secret.encode()).decode()


def headers(secret: str, delivery_id: str, event: str, timestamp: int, raw: bytes) -> dict[str, str]:
    return {DELIVERY: delivery_id, TIMESTAMP: str(timestamp), EVENT: event,
            SIGNATURE: signature(secret, delivery_id, timestamp, raw),
            STANDARD_ID: delivery_id, STANDARD_TIMESTAMP: str(timestamp),
            STANDARD_SIGNATURE: standard_signature(secret, delivery_id, timestamp, raw),
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
