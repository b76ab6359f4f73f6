"""Who is asking: every request of the API is made as a user (mxq.users), found by its bearer
token or its dashboard session.

- MXQ_API_TOKEN is the token of the user `admin` (made by migration 0018), as it was the one
  token before users existed;
- `mxq_<id>_<secret>` is a user's own token (`mxq users add`), checked against its scrypt hash;
- the cookie `mxq_session` is a dashboard login (`mxq.api.session`: a token exchanged once);
  a write made with it carries its CSRF token in `X-CSRF-Token`;
- no credential at all is `local:api`, an admin, only while the API has no token of any kind
  and only for a loopback client: checked here, whatever server runs the app. Once
  MXQ_API_TOKEN is set or any user has a token, every route but the login needs a credential
  (401), reads as well as writes.

What a caller may read of what another owns follows `mxq.users.may_read`: history rows are
everyone's, results (predictions, output files) their owner's, their team's and admins'.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer

from mxq import tokens
from mxq.db.errors import DATABASE_UNAVAILABLE
from mxq.db.sharing import sessions, users
from mxq.db.sharing.teams import teams_of
from mxq.errors import Forbidden
from mxq.users import LOCAL_API, TOKEN_ADMIN, Role, may_change, may_read, may_submit
from mxq.workers.settings import Settings, get_settings

bearer = HTTPBearer(auto_error=False, description="A user's token (`mxq users add`), or "
                    "MXQ_API_TOKEN, the admin's, when the server has one set.")
SESSION_COOKIE = "mxq_session"
CSRF_HEADER = "X-CSRF-Token"
session_cookie = APIKeyCookie(name=SESSION_COOKIE, auto_error=False, description="A dashboard "
                              "login (POST /api/v1/session); its writes carry X-CSRF-Token.")
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
# How many checked tokens the process remembers (by SHA-256, with the hash they matched).
CHECKED_TOKENS = 1024


@dataclass(frozen=True)
class Caller:
    name: str
    role: Role
    teams: frozenset[str] = frozenset()
    csrf: str | None = None  # its dashboard session's, when it came by the cookie

    def may_change(self, owner: str | None, what: str) -> None:
        """Forbidden unless the caller may cancel or change `what`, which `owner` owns."""
        if not may_change(self.role, self.name, owner):
            raise Forbidden(f"user {self.name!r} (role {self.role}) may not change {what}, which "
                            f"{owner or 'nobody'} owns: only its owner (role submit) or an admin may")

    def may_read(self, owner: str | None, team: str | None) -> bool:
        return may_read(self.role, self.name, self.teams, owner, team)

    def check_read(self, owner: str | None, team: str | None, what: str) -> None:
        """Forbidden unless the caller may read `what` (a job's results), which `owner` owns."""
        if not self.may_read(owner, team):
            shared = f", shared with team {team!r}" if team else ", shared with no team"
            raise Forbidden(f"user {self.name!r} may not read {what}: it belongs to "
                            f"{owner or 'nobody'}{shared}; its owner, that team's members and "
                            "admins may")


class _Checked:
    """Tokens already checked against a hash: scrypt costs tens of milliseconds a request. Keyed
    by the token's SHA-256 and kept with the hash it matched, so a token replaced or a user
    removed fails at once (each request still reads the user's row)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, str] = {}

    def verify(self, token: str, secret: str, stored: str) -> bool:
        key = tokens.fingerprint(token)
        with self._lock:
            if self._seen.get(key) == stored:
                return True
        if not tokens.verify(secret, stored):
            return False
        with self._lock:
            if len(self._seen) >= CHECKED_TOKENS:
                self._seen.clear()
            self._seen[key] = stored
        return True


_checked = _Checked()


def settings() -> Settings:
    """The settings every route reads (one function, so a test's override reaches them all)."""
    return get_settings()


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def from_token(s: Settings, given: str) -> Caller:
    """The user a bearer token (or one given to the login) is: 401 for any other string."""
    given = given.strip()
    admin_token = s.api_token.get_secret_value() if s.api_token else None
    if admin_token is not None and secrets.compare_digest(given.encode(), admin_token.encode()):
        role = users.token_admin_role(s.database)
        if role is None:
            raise _unauthorized(f"MXQ_API_TOKEN is the token of user {TOKEN_ADMIN!r}, which was "
                                "removed; `mxq users add` gives a user a token")
        return Caller(TOKEN_ADMIN, role, teams_of(s.database, TOKEN_ADMIN))
    parsed = tokens.parse(given)
    found = users.by_token_id(s.database, parsed[0]) if parsed else None
    if parsed is None or found is None or not _checked.verify(given, parsed[1], found["token_hash"]):
        raise _unauthorized("this token is no user's: send Authorization: Bearer <token> with a "
                            "token `mxq users add` printed, or MXQ_API_TOKEN")
    return Caller(found["name"], found["role"], teams_of(s.database, found["name"]))


def _from_session(request: Request, s: Settings, cookie: str) -> Caller:
    """The dashboard session's user; a write must carry the session's CSRF token."""
    found = sessions.find(s.database, cookie)
    if found is None:
        raise _unauthorized("this dashboard session has ended (logged out, expired or its user "
                            "removed): log in again")
    if request.method not in SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not secrets.compare_digest(sent.encode(), found["csrf"].encode()):
            raise Forbidden(f"a write made with the dashboard's session needs its {CSRF_HEADER} "
                            "header (the csrf the login answered)")
    return Caller(found["name"], found["role"], teams_of(s.database, found["name"]),
                  found["csrf"])


def is_loopback_client(request: Request) -> bool:
    """The request's peer is this machine (127.0.0.0/8, ::1, or an IPv4-mapped loopback)."""
    host = request.client.host if request.client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # no address (a unix socket without a peer, a test client's name)
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def tokenless(s: Settings) -> bool:
    """No token of any kind: the stack's token-less mode (loopback clients are its admin)."""
    return s.api_token is None and users.with_tokens(s.database) == 0


def caller(request: Request,
           credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
           cookie: Annotated[str | None, Depends(session_cookie)],
           s: Settings = Depends(settings)) -> Caller:
    """The user a request is made as: its bearer token, else its dashboard session, else, in
    the token-less mode and from loopback only, `local:api` (401 otherwise)."""
    given = credentials.credentials.strip() if credentials else ""
    if given:
        return from_token(s, given)
    if cookie:
        return _from_session(request, s, cookie)
    if tokenless(s):
        if is_loopback_client(request):
            return Caller(LOCAL_API, Role.ADMIN)
        raise _unauthorized("this stack has no tokens, so its API answers only clients on its own "
                            "machine (loopback); give users tokens (`mxq users add`) or set "
                            "MXQ_API_TOKEN to serve other hosts")
    raise _unauthorized("this endpoint needs the header Authorization: Bearer <token> (a user's "
                        "token, from `mxq users add`, or MXQ_API_TOKEN) or a dashboard login")


def submitter(who: Annotated[Caller, Depends(caller)]) -> Caller:
    """A caller that may submit: role submit or admin (403 for read)."""
    if not may_submit(who.role):
        raise Forbidden(f"user {who.name!r} has role {who.role}, which may only read; submitting "
                        "needs role submit or admin (`mxq users set NAME --role submit`)")
    return who


# What each admin-only route family does, for the 403 that names it.
ADMIN_WORK = {"/api/v1/archs": "registering an architecture's code (which workers import and run)",
              "/api/v1/hooks": "managing webhooks (an endpoint hears every user's events)"}


def admin(request: Request, who: Annotated[Caller, Depends(caller)]) -> Caller:
    """A caller with role admin (403 for the others, naming what the route does)."""
    if who.role is not Role.ADMIN:
        work = next((w for prefix, w in ADMIN_WORK.items() if request.url.path.startswith(prefix)),
                    f"{request.method} {request.url.path}")
        raise Forbidden(f"user {who.name!r} has role {who.role}; {work} needs role admin")
    return who


def reader(who: Annotated[Caller, Depends(caller)]) -> Caller:
    """A user of any role: every read needs one (what it may read of others' is checked per route)."""
    return who


def scraper(request: Request,
            credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
            cookie: Annotated[str | None, Depends(session_cookie)],
            s: Settings = Depends(settings)) -> bool:
    """Who may read /metrics (its labels name owners and devices): MXQ_METRICS_TOKEN, the token
    Prometheus is given, or an admin (the token-less mode's loopback admin included): True.
    False while the database is down and so cannot say who asks: then only the two up gauges
    are served, which name no one, so that a health scrape still says what is down."""
    given = credentials.credentials.strip() if credentials else ""
    wanted = s.metrics_token.get_secret_value() if s.metrics_token else None
    if given and wanted is not None and secrets.compare_digest(given.encode(), wanted.encode()):
        return True
    try:
        who = caller(request, credentials, cookie, s)
    except DATABASE_UNAVAILABLE:
        return False
    if who.role is not Role.ADMIN:
        raise Forbidden(f"user {who.name!r} has role {who.role}; /metrics is served to admins and "
                        "to MXQ_METRICS_TOKEN (Prometheus's bearer token)")
    return True
