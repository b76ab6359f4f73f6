"""What a browser must not be able to make the API do: the checks on a request's headers before
any route runs.

- **Host**: a request must name a host the API serves (loopback names, `MXQ_API_HOST`, this
  machine's host name, `MXQ_API_HOSTS`); a page whose DNS name is rebound to 127.0.0.1 sends its
  own name and is refused (421), so it cannot read or write through a loopback API.
- **Origin**: without a token, a write from a page of another origin (an auto-submitted form, a
  script) is refused (403); the dashboard's own requests and programs that send no `Origin` pass.
- **Content type**: a write with a body must say `application/json`: a form (`text/plain`,
  `application/x-www-form-urlencoded`, `multipart/form-data`) or `application/evil+json` is
  refused (415) instead of parsed as JSON.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from functools import lru_cache
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from mxq.db.engine import answers_within
from mxq.workers.settings import Settings, is_loopback

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
# Hosts that mean "every interface": the API then serves whatever name reaches it, unless
# MXQ_API_HOSTS lists the names.
WILDCARDS = {"0.0.0.0", "::", ""}


def _host_name(value: str) -> str:
    """The host of a Host header or an Origin's netloc, without its port, lower case."""
    host = urlsplit(f"//{value}").hostname or ""
    return host.lower()


def served_names(s: Settings) -> frozenset[str] | None:
    """The names a request's Host may give; None when any will do (a wildcard bind without
    MXQ_API_HOSTS)."""
    return _served(s.api_host, s.api_hosts)


@lru_cache(maxsize=8)
def _served(api_host: str, api_hosts: str | None) -> frozenset[str] | None:
    """Worked out once per setting, not at every request."""
    extra = {h.strip().lower() for h in (api_hosts or "").split(",") if h.strip()}
    if api_host in WILDCARDS and not extra:
        return None
    return frozenset(LOOPBACK_NAMES | {api_host.lower().strip("[]"), socket.gethostname().lower()} | extra)


def refusal(s: Settings, method: str, headers: dict[bytes, bytes],
            has_body: bool) -> tuple[int, str] | None:
    """(status, why) for a request the API must not serve, else None."""
    host_header = headers.get(b"host", b"").decode("latin-1").strip().lower()
    wrong_host = _wrong_host(s, host_header)
    if wrong_host is not None or method not in WRITES:
        return wrong_host
    foreign = _foreign_origin(s, headers.get(b"origin"), host_header)
    if foreign is not None or not has_body:
        return foreign
    return _not_json(headers)


def _wrong_host(s: Settings, host_header: str) -> tuple[int, str] | None:
    """421 for a Host this API does not serve (a DNS rebinding page's, say)."""
    host = _host_name(host_header)
    names = served_names(s)
    if names is not None and host not in names and not (is_loopback(host) and s.api_on_loopback):
        return 421, (f"Host {host or '(none)'!r} is not a name this API serves "
                     f"({', '.join(sorted(names))}; more with MXQ_API_HOSTS)")
    return None


def _foreign_origin(s: Settings, origin: bytes | None, host_header: str) -> tuple[int, str] | None:
    """403 for a write from another origin's page while no token guards the API."""
    if s.api_token is None and origin is not None:  # same origin: the same host and port
        if urlsplit(origin.decode("latin-1").strip()).netloc.lower() != host_header:
            return 403, (f"a write from the page origin {origin.decode('latin-1')[:100]!r} is refused: "
                         "without MXQ_API_TOKEN only this API's own pages and programs may write")
    return None


def _not_json(headers: dict[bytes, bytes]) -> tuple[int, str] | None:
    """415 for a body that is not JSON (a form a page may post across origins without asking)."""
    kind = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if kind != "application/json":
        return 415, (f"Content-Type {kind or '(none)'!r} is refused: a request body must be "
                     "application/json")
    return None


# Seconds a request waits for PostgreSQL's answer to one statement: past it, a 503 (with the
# reconnect that follows, about 15 s from a frozen database). Shorter than a worker's bound
# (db/engine.ANSWER_SECONDS) so the health check (`GET /api/v1/devices`) hears 503 while its
# caller still waits; long enough for a loaded server's slowest read.
DATABASE_ANSWER_SECONDS = 10.0


class RequestGuard:
    """ASGI middleware applying `refusal` to every HTTP request (the settings through the same
    lookup the routes use, so a test's override holds), and bounding its waits for the database
    (`DATABASE_ANSWER_SECONDS`)."""

    def __init__(self, app: ASGIApp, settings: Callable[[Scope], Settings],
                 answer: Callable[[int, str], ASGIApp]) -> None:
        self.app, self.settings, self.answer = app, settings, answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            length = headers.get(b"content-length", b"0")
            has_body = b"transfer-encoding" in headers or (length.isdigit() and int(length) > 0)
            refused = refusal(self.settings(scope), scope["method"], headers, has_body)
            if refused is not None:
                await self.answer(*refused)(scope, receive, send)
                return
        with answers_within(DATABASE_ANSWER_SECONDS):  # the routes' threads inherit it
            await self.app(scope, receive, send)
