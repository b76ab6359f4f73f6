"""The webhook sender, run by the schedule process (`mxq.hooks`, every
MXQ_HOOK_SECONDS by Celery beat): due deliveries are claimed from the outbox
(`mxq.db.webhooks.outbox.claim_due`, one attempt each, never twice) and POSTed each from a
daemon thread of its own, at most MAX_SENDING at once. The pass returns at once, and an
endpoint that hangs holds one thread for MXQ_HOOK_TIMEOUT_SECONDS, never the control queue's
tick or reconciler, a worker or the API (they only insert outbox rows).

Each attempt checks the endpoint again (MXQ_HOOK_ALLOWED_HOSTS, the addresses its name resolves
to now) and connects to the address it checked. Redirects are never followed: a 3xx is a failed
attempt, retried as any other answer but a 2xx. A log line names the endpoint's id and host,
never its secret or its URL's path (some services put a token there).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

import httpx

from mxq.db.records import HookCreated
from mxq.db.schema import utcnow
from mxq.db.webhooks import endpoints, outbox
from mxq.db.webhooks.outbox import Claimed
from mxq.workers.settings import Settings
from mxq.workers.webhooks import signing, targets

log = logging.getLogger(__name__)
# httpx logs every request's URL at INFO, a hook's path and query (where some services put a token)
# with it: only its warnings reach the log.
logging.getLogger("httpx").setLevel(logging.WARNING)

MAX_SENDING = 8  # attempts in flight at once in one process: hung endpoints hold at most these

_lock = threading.Lock()
_sending: set[threading.Thread] = set()


def add_hook(settings: Settings, url: str, events: list[str], owner: str | None) -> HookCreated:
    """An endpoint added once its URL passed the allowlist and its addresses resolved to what
    the allowlist allows; the answer carries its secret, shown this once."""
    targets.checked(url, settings.hook_allowlist)
    return endpoints.add_hook(settings.database, url, events, owner)


def post(settings: Settings, claimed: Claimed) -> tuple[int | None, str | None]:
    """One attempt: (the answer's status or None, why it failed or None)."""
    try:
        point, address = targets.checked(claimed.url, settings.hook_allowlist)
    except targets.HookRefused as exc:
        return None, f"refused: {exc}"
    raw = signing.body(claimed.id, claimed.event, claimed.created_at, claimed.payload)
    head = {**signing.headers(claimed.secret, claimed.id, claimed.event, int(time.time()), raw),
            "Host": point.host_header}
    extensions = {"sni_hostname": point.host} if point.scheme == "https" else {}
    seconds = settings.hook_timeout_seconds
    try:
        with httpx.Client(timeout=httpx.Timeout(seconds), follow_redirects=False,
                          trust_env=False) as client:
            request = client.build_request("POST", point.at(address), content=raw, headers=head,
                                           extensions=extensions)
            answer = client.send(request, stream=True)
            answer.close()  # the status is the answer: its body is never read
    except httpx.TimeoutException:
        return None, f"no answer within {seconds:g} s (MXQ_HOOK_TIMEOUT_SECONDS)"
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__} connecting to {point.host}"
    if answer.is_redirect:
        where = httpx.URL(answer.headers.get("location", "")).host or point.host
        return answer.status_code, f"answered {answer.status_code}, a redirect to {where} (not followed)"
    return answer.status_code, None if answer.is_success else f"answered {answer.status_code}"


def deliver(settings: Settings, claimed: Claimed, now: datetime | None = None) -> str | None:
    """Make one claimed attempt and record its answer (at `now`, or the time it ended)."""
    host = targets.endpoint_host(claimed.url)
    try:
        code, error = post(settings, claimed)
    except Exception as exc:  # a bug must not lose the attempt's record
        code, error = None, f"{type(exc).__name__}: {exc}"
        log.exception("webhook %s delivery %s failed unexpectedly", claimed.hook_id, claimed.id)
    status = outbox.settle(settings.database, claimed, now or utcnow(), code, error)
    log.info("webhook %s (%s) delivery %s %s attempt %d: %s", claimed.hook_id, host, claimed.id,
             claimed.event, claimed.attempt, status if error is None else f"{status}, {error}")
    return status


def _busy() -> int:
    with _lock:
        _sending.difference_update([t for t in _sending if not t.is_alive()])
        return len(_sending)


def send_due(settings: Settings, now: datetime | None = None, wait: bool = False) -> int:
    """Claim the due deliveries (as of `now`, which also dates their answers: tests pass a
    clock) that free threads can take, and send each from its own thread; with `wait`, return
    once they all ended. How many were claimed."""
    claimed = outbox.claim_due(settings.database, now or utcnow(), MAX_SENDING - _busy())
    threads = [threading.Thread(target=deliver, args=(settings, c, now), daemon=True,
                                name=f"webhook-{c.id}") for c in claimed]
    with _lock:
        _sending.update(threads)
    for t in threads:
        t.start()
    if wait:
        for t in threads:
            t.join()
    return len(claimed)
