"""The webhook sender, run by the schedule process (`mxq.hooks`, every
MXQ_HOOK_SECONDS by Celery beat): due deliveries are claimed from the outbox
(`mxq.db.webhooks.outbox.claim_due`, one attempt each, never twice) and POSTed by up to
MAX_SENDING daemon threads, each of which claims the next due delivery as soon as it is done
with one, until none is due: endpoints that answer at once get hundreds a second, not a pass's
worth every MXQ_HOOK_SECONDS. The pass returns at once; no endpoint holds the control queue's
tick or reconciler, a worker or the API (they only insert outbox rows).

A slow endpoint cannot starve the others: at most PER_ENDPOINT of its attempts are in flight at
once (the threads claim around it), and every attempt has a total deadline,
MXQ_HOOK_TIMEOUT_SECONDS from connecting to the answer's status line, whatever pace the
endpoint dribbles its bytes at (a watchdog shuts the socket down at the deadline).

Each attempt checks the endpoint again (MXQ_HOOK_ALLOWED_HOSTS, the addresses its name resolves
to now) and connects to the address it checked. Redirects are never followed: a 3xx is a failed
attempt, retried as any other answer but a 2xx. A log line names the endpoint's id and host,
never its secret or its URL's path (some services put a token there); the POST is made with
the standard library's http.client, which logs nothing.
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from datetime import datetime
from urllib.parse import urlsplit

from mxq.db.records import HookCreated
from mxq.db.schema import utcnow
from mxq.db.webhooks import endpoints, outbox
from mxq.db.webhooks.outbox import Claimed
from mxq.workers.settings import Settings
from mxq.workers.settings.webhooks import IPAddress, WebhookSettings
from mxq.workers.webhooks import signing, targets
from mxq.workers.webhooks.targets import Endpoint

log = logging.getLogger(__name__)

MAX_SENDING = 8  # sender threads in one process: hung endpoints hold at most these
PER_ENDPOINT = 2  # attempts in flight to one endpoint at once: a slow one holds at most these
REDIRECTS = (301, 302, 303, 307, 308)

_lock = threading.Lock()  # claims are made under it, so the per-endpoint count is exact
_sending: set[threading.Thread] = set()
_in_flight: Counter[int] = Counter()  # endpoint id -> its attempts being made now


def add_hook(settings: Settings, url: str, events: list[str], owner: str | None) -> HookCreated:
    """An endpoint added once its URL passed the allowlist and its addresses resolved to what
    the allowlist allows; the answer carries its secret, shown this once."""
    targets.checked(url, settings.webhooks.allowlist)
    created = endpoints.add_hook(settings.database, url, events, owner)
    return {**created, "standard_secret": signing.standard_secret(created["secret"])}


class _Cut(Exception):
    """The attempt's total deadline passed (the watchdog shut its socket down)."""


def _exchange(point: Endpoint, address: IPAddress, raw: bytes, head: dict[str, str],
              seconds: float) -> tuple[int, str | None]:
    """POST `raw` to the checked address and read the answer's status line and headers (never its
    body), all within `seconds`: (status, Location header)."""
    deadline = time.monotonic() + seconds
    sock = socket.create_connection((str(address), point.port), timeout=seconds)
    current = [sock]
    cut = threading.Event()

    def watchdog() -> None:
        cut.set()
        try:
            current[-1].shutdown(socket.SHUT_RDWR)  # wakes a read blocked on a dribbling endpoint
        except OSError:
            pass

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), watchdog)
    timer.daemon = True
    timer.start()
    try:
        if point.scheme == "https":
            current.append(ssl.create_default_context().wrap_socket(sock, server_hostname=point.host))
        conn = http.client.HTTPConnection(str(address), point.port, timeout=seconds)
        conn.sock = current[-1]
        try:
            conn.request("POST", point.target, body=raw, headers=head)
            answer = conn.getresponse()
        except (OSError, http.client.HTTPException):
            if cut.is_set():
                raise _Cut from None
            raise
        return answer.status, answer.getheader("location")
    finally:
        timer.cancel()
        for opened in reversed(current):
            opened.close()


def post(hooks: WebhookSettings, claimed: Claimed) -> tuple[int | None, str | None]:
    """One attempt: (the answer's status or None, why it failed or None)."""
    try:
        point, address = targets.checked(claimed.url, hooks.allowlist)
    except targets.HookRefused as exc:
        return None, f"refused: {exc}"
    raw = signing.body(claimed.id, claimed.event, claimed.created_at, claimed.payload)
    head = {**signing.headers(claimed.secret, claimed.id, claimed.event, int(time.time()), raw),
            "Host": point.host_header, "Content-Length": str(len(raw))}
    seconds = hooks.timeout_seconds
    try:
        status, location = _exchange(point, address, raw, head, seconds)
    except (_Cut, TimeoutError):
        return None, f"no answer within {seconds:g} s (MXQ_HOOK_TIMEOUT_SECONDS)"
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__} connecting to {point.host}"
    if status in REDIRECTS:
        where = _host_of(location) or point.host
        return status, f"answered {status}, a redirect to {where} (not followed)"
    return status, None if 200 <= status < 300 else f"answered {status}"


def _host_of(location: str | None) -> str | None:
    """The host a redirect names (a relative one names none)."""
    try:
        return urlsplit(location or "").hostname
    except ValueError:
        return None


def deliver(database: str, hooks: WebhookSettings, claimed: Claimed,
            now: datetime | None = None) -> str | None:
    """Make one claimed attempt and record its answer in `database` (at `now`, or the time it
    ended)."""
    host = targets.endpoint_host(claimed.url)
    try:
        code, error = post(hooks, claimed)
    except Exception as exc:  # a bug must not lose the attempt's record
        code, error = None, f"{type(exc).__name__}: {exc}"
        log.exception("webhook %s delivery %s failed unexpectedly", claimed.hook_id, claimed.id)
    status = outbox.settle(database, claimed, now or utcnow(), code, error)
    log.info("webhook %s (%s) delivery %s %s attempt %d: %s", claimed.hook_id, host, claimed.id,
             claimed.event, claimed.attempt, status if error is None else f"{status}, {error}")
    return status


def _claim_next(database: str, now: datetime | None) -> Claimed | None:
    """The next due delivery to an endpoint with fewer than PER_ENDPOINT attempts in flight,
    counted in flight once claimed (None when none is due)."""
    with _lock:
        full = [hook for hook, n in _in_flight.items() if n >= PER_ENDPOINT]
        claimed = outbox.claim_due(database, now or utcnow(), 1, skip_hooks=full)
        if not claimed:
            return None
        _in_flight[claimed[0].hook_id] += 1
        return claimed[0]


def _sender(database: str, hooks: WebhookSettings, now: datetime | None, sent: list[int]) -> None:
    """A sender thread: deliver one due delivery after another until none is due."""
    while (claimed := _claim_next(database, now)) is not None:
        try:
            deliver(database, hooks, claimed, now)
            sent.append(1)
        finally:
            with _lock:
                _in_flight[claimed.hook_id] -= 1
                if _in_flight[claimed.hook_id] <= 0:
                    del _in_flight[claimed.hook_id]


def _busy() -> int:
    with _lock:
        _sending.difference_update([t for t in _sending if not t.is_alive()])
        return len(_sending)


def send_due(settings: Settings, now: datetime | None = None, wait: bool = False) -> int:
    """Start sender threads, up to MAX_SENDING in all, on the due deliveries (as of `now`, which
    also dates their answers: tests pass a clock). Returns at once with how many threads it
    started; with `wait`, once they all ended, with how many deliveries they made."""
    sent: list[int] = []
    database, hooks = settings.database, settings.webhooks
    free = MAX_SENDING - _busy()
    wanted = min(free, outbox.count_due(database, now or utcnow(), free)) if free else 0
    threads = [threading.Thread(target=_sender, args=(database, hooks, now, sent), daemon=True,
                                name="webhook-sender") for _ in range(wanted)]
    with _lock:
        _sending.update(threads)
    for t in threads:
        t.start()
    if not wait:
        return len(threads)
    for t in threads:
        t.join()
    return len(sent)
