"""The dashboard's logins: a user's token exchanged once for a session cookie.

The cookie is 32 random bytes; only its SHA-256 is stored (a stolen table opens no session), with
the CSRF token the session's writes must carry and the time it ends. A removed user's sessions
go with it (`users.remove`); a user given a new token keeps its sessions until they end or it
logs out.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import TypedDict

from sqlalchemy import delete, select

from mxq.db.engine import session_scope
from mxq.db.schema import LoginSession, User, as_utc, iso, utcnow
from mxq.users import Role

# How long a login lasts: a working day, so a dashboard left open overnight asks again.
SESSION_SECONDS = 12 * 3600


class SessionUser(TypedDict):
    """The user a session cookie stands for, with the CSRF token its writes carry."""

    name: str
    role: Role
    csrf: str
    expires_at: str | None


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


def open_session(url: str, user: str) -> tuple[str, SessionUser]:
    """A new session of `user` (one the caller has just authenticated): (cookie, its user)."""
    cookie, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    now = utcnow()
    with session_scope(url) as session:
        session.execute(delete(LoginSession).where(LoginSession.expires_at < now))  # the ended
        role = Role(session.get(User, user).role)  # type: ignore[union-attr]
        expires = now + timedelta(seconds=SESSION_SECONDS)
        session.add(LoginSession(id_hash=_digest(cookie), user=user, csrf=csrf, created_at=now,
                                 expires_at=expires))
    return cookie, {"name": user, "role": role, "csrf": csrf, "expires_at": iso(expires)}


def find(url: str, cookie: str, now: datetime | None = None) -> SessionUser | None:
    """The live session's user (its current role), or None: unknown, ended, user removed."""
    with session_scope(url) as session:
        row = session.execute(select(LoginSession, User).join(User, User.name == LoginSession.user)
                              .where(LoginSession.id_hash == _digest(cookie))).first()
        if row is None:
            return None
        login, user = row
        if as_utc(login.expires_at) <= (now or utcnow()) or user.removed_at is not None:
            return None
        return {"name": user.name, "role": Role(user.role), "csrf": login.csrf,
                "expires_at": iso(login.expires_at)}


def close(url: str, cookie: str) -> None:
    """Log out: the cookie opens nothing from now on."""
    with session_scope(url) as session:
        session.execute(delete(LoginSession).where(LoginSession.id_hash == _digest(cookie)))
