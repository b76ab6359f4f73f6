"""A delivery's signature against fixed test vectors, computed outside mxq (OpenSSL:
`printf '%s' "$ID.$TS.$BODY" | openssl dgst -sha256 -hmac "$SECRET"`), so a signer that leaves
out the body, the id or the time, or a verifier that accepts anything, fails here; and the
verification snippet of docs/webhooks.md, executed, agrees with them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from mxq.workers.webhooks import signing
from tests.hooks.receiver import Verify, docs_verify

SECRET = "test-secret-not-for-production"
DELIVERY = "dlv_0123456789abcdef"
TIMESTAMP = 1767225600
BODY = b'{"data":{"job":{"id":42}},"event":"job.finished","id":"dlv_0123456789abcdef"}'
SIGNED = "sha256=f2e4cf0e1682f3772c130967e04542bfb8d678a838e2023c3ca3fb9f5ee88987"  # OpenSSL's answer
# The same HMAC in Standard Webhooks' form (OpenSSL's `-binary | base64`), and the secret as its
# libraries take it (`printf '%s' "$SECRET" | base64`, after `whsec_`).
STANDARD_SIGNED = "v1,8uTPDhaC83csEwln4EVCv7jWeKg44gI8PKP7n17oiYc="
STANDARD_SECRET = "whsec_dGVzdC1zZWNyZXQtbm90LWZvci1wcm9kdWN0aW9u"


def _headers(delivery: str = DELIVERY, timestamp: str = str(TIMESTAMP), sent: str = SIGNED) -> dict[str, str]:
    return {signing.DELIVERY: delivery, signing.TIMESTAMP: timestamp, signing.SIGNATURE: sent}


@pytest.fixture
def at_the_timestamp(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The receiver's clock reads the vector's timestamp (the docs' snippet reads time.time())."""
    monkeypatch.setattr(time, "time", lambda: float(TIMESTAMP))
    yield


def test_the_signer_gives_the_vector() -> None:
    assert signing.signature(SECRET, DELIVERY, TIMESTAMP, BODY) == SIGNED
    sent = signing.headers(SECRET, DELIVERY, "job.finished", TIMESTAMP, BODY)
    assert sent[signing.SIGNATURE] == SIGNED and sent[signing.TIMESTAMP] == str(TIMESTAMP)
    assert sent[signing.DELIVERY] == DELIVERY


def test_the_body_the_id_and_the_time_are_each_signed() -> None:
    assert signing.signature(SECRET, DELIVERY, TIMESTAMP, BODY + b" ") != SIGNED
    assert signing.signature(SECRET, DELIVERY + "0", TIMESTAMP, BODY) != SIGNED
    assert signing.signature(SECRET, DELIVERY, TIMESTAMP + 1, BODY) != SIGNED
    assert signing.signature(SECRET + "x", DELIVERY, TIMESTAMP, BODY) != SIGNED


@pytest.mark.parametrize("verify", ["product", "docs"])
def test_a_verifier_accepts_the_vector_and_refuses_each_tampering(verify: str,
                                                                  at_the_timestamp: None) -> None:
    check = _product if verify == "product" else _docs(docs_verify())
    assert check(_headers(), BODY)
    assert not check(_headers(), BODY.replace(b"42", b"43"))  # the body
    assert not check(_headers(delivery="dlv_0123456789abcdee"), BODY)  # the id
    assert not check(_headers(timestamp=str(TIMESTAMP - 1)), BODY)  # the time
    assert not check(_headers(sent=SIGNED[:-1] + "8"), BODY)  # the signature
    assert not check(_headers(timestamp="1767225600.0"), BODY)
    assert not check(_headers(timestamp="x"), BODY)


@pytest.mark.parametrize("verify", ["product", "docs"])
def test_a_verifier_refuses_an_old_delivery(verify: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay: the right signature, a timestamp past the tolerance."""
    check = _product if verify == "product" else _docs(docs_verify())
    monkeypatch.setattr(time, "time", lambda: float(TIMESTAMP + signing.TOLERANCE_SECONDS))
    assert check(_headers(), BODY)
    monkeypatch.setattr(time, "time", lambda: float(TIMESTAMP + signing.TOLERANCE_SECONDS + 1))
    assert not check(_headers(), BODY)


def _product(headers: dict[str, str], body: bytes) -> bool:
    return signing.verify(SECRET, headers[signing.DELIVERY], headers[signing.TIMESTAMP], body,
                          headers[signing.SIGNATURE], time.time())


def _docs(verify: Verify) -> Callable[[dict[str, str], bytes], bool]:
    return lambda headers, body: verify(SECRET, headers, body)


def test_the_standard_webhooks_headers_give_the_vector_and_its_library_verifies_them() -> None:
    """Issue 62: a delivery carries webhook-id, webhook-timestamp and webhook-signature, which the
    `standardwebhooks` library verifies with the endpoint's secret in its whsec_ form; a
    tampered body, id or timestamp, or the raw secret, is refused."""
    from datetime import UTC, datetime

    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    sent = signing.headers(SECRET, DELIVERY, "job.finished", TIMESTAMP, BODY)
    standard = {k: sent[k] for k in (signing.STANDARD_ID, signing.STANDARD_TIMESTAMP,
                                     signing.STANDARD_SIGNATURE)}
    assert standard == {"webhook-id": DELIVERY, "webhook-timestamp": str(TIMESTAMP),
                        "webhook-signature": STANDARD_SIGNED}
    assert signing.standard_secret(SECRET) == STANDARD_SECRET
    hook = Webhook(STANDARD_SECRET)
    assert hook.sign(DELIVERY, datetime.fromtimestamp(TIMESTAMP, UTC), BODY) == STANDARD_SIGNED
    now = int(time.time())  # the library checks the timestamp against its own clock
    fresh = signing.headers(SECRET, DELIVERY, "job.finished", now, BODY)
    standard = {k: fresh[k] for k in standard}
    assert hook.verify(BODY, standard)["id"] == DELIVERY
    for tampered in ({**standard, "webhook-id": "dlv_other"},
                     {**standard, "webhook-timestamp": str(now + 1)}):
        with pytest.raises(WebhookVerificationError):
            hook.verify(BODY, tampered)
    with pytest.raises(WebhookVerificationError):
        hook.verify(BODY.replace(b"42", b"43"), standard)
    with pytest.raises(WebhookVerificationError):  # the raw secret is not the whsec_ form
        Webhook(SECRET).verify(BODY, standard)
