"""Who is asking: every write of the API is made as a user (mxq.users), found by its bearer token.

- MXQ_API_TOKEN is the token of the user `admin` (made by migration 0018), as it was the one
  token before users existed;
- `mxq_<id>_<secret>` is a user's own token (`mxq users add`), checked against its scrypt hash;
- no token at all is `local:api`, an admin, only while the API has no token of any kind: then
  it listens on loopback only. Once MXQ_API_TOKEN is set or any user has a token, a write
  without one is refused (401).
Reads stay open, as before users: the dashboard reads without a token.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from mxq import tokens
from mxq.db.sharing import users
from mxq.errors import Forbidden
from mxq.users import LOCAL_API, TOKEN_ADMIN, Role, may_change, may_submit
from mxq.workers.settings import Settings, get_settings

bearer = HTTPBearer(auto_error=False, description="A user's token (`mxq users add`), or "
                    "MXQ_API_TOKEN, the admin's, when the server has one set.")
# How many checked tokens the process remembers (by SHA-256, with the hash they matched).
CHECKED_TOKENS = 1024


@dataclass(frozen=True)
class Caller:
    name: str
    role: Role

    def may_change(self, owner: str | None, what: str) -> None:
        """Forbidden unless the caller may cancel or change `what`, which `owner` owns."""
        if not may_change(self.role, self.name, owner):
            raise Forbidden(f"user {self.name!r} (role {self.role}) may not change {what}, which "
                            f"{owner or 'nobody'} owns: only its owner (role submit) or an admin may")


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


def _from_token(s: Settings, given: str) -> Caller:
    admin_token = s.api_token.get_secret_value() if s.api_token else None
    if admin_token is not None and secrets.compare_digest(given.encode(), admin_token.encode()):
        role = users.token_admin_role(s.database)
        if role is None:
            raise _unauthorized(f"MXQ_API_TOKEN is the token of user {TOKEN_ADMIN!r}, which was "
                                "removed; `mxq users add` gives a user a token")
        return Caller(TOKEN_ADMIN, role)
    parsed = tokens.parse(given)
    found = users.by_token_id(s.database, parsed[0]) if parsed else None
    if parsed is None or found is None or not _checked.verify(given, parsed[1], found["token_hash"]):
        raise _unauthorized("this token is no user's: send Authorization: Bearer <token> with a "
                            "token `mxq users add` printed, or MXQ_API_TOKEN")
    return Caller(found["name"], found["role"])


def caller(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
           s: Settings = Depends(settings)) -> Caller:
    """The user a write is made as (401 without a token where one is needed)."""
    given = credentials.credentials.strip() if credentials else ""
    if given:
        return _from_token(s, given)
    if s.api_token is None and users.with_tokens(s.database) == 0:
        return Caller(LOCAL_API, Role.ADMIN)  # no token of any kind: loopback only
    raise _unauthorized("this endpoint needs the header Authorization: Bearer <token> (a user's "
                        "token, from `mxq users add`, or MXQ_API_TOKEN)")


def submitter(who: Annotated[Caller, Depends(caller)]) -> Caller:
    """A caller that may submit: role submit or admin (403 for read)."""
    if not may_submit(who.role):
        raise Forbidden(f"user {who.name!r} has role {who.role}, which may only read; submitting "
                        "needs role submit or admin (`mxq users set NAME --role submit`)")
    return who


def admin(who: Annotated[Caller, Depends(caller)]) -> Caller:
    if who.role is not Role.ADMIN:
        raise Forbidden(f"user {who.name!r} has role {who.role}; this needs role admin")
    return who
