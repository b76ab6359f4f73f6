"""The users table (mxq.users): add, list, change and remove users, and find a token's user.

Only the scrypt hash of a token is stored (mxq.tokens); the token itself is returned once, by
`add` and `set_user(new_token=True)`, for the CLI to print.
"""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy import ColumnElement, delete, exists, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from mxq import tokens
from mxq.db.engine import session_scope
from mxq.db.schema import Hook, LoginSession, Schedule, TeamMember, User, iso, utcnow
from mxq.errors import Conflict, NotFound
from mxq.shares import Share
from mxq.users import TOKEN_ADMIN, Role


class UserRecord(TypedDict):
    """One user (`mxq users ls --json`): never its token or hash."""

    name: str
    role: str
    has_token: bool  # False for `admin` of MXQ_API_TOKEN
    created_at: str | None
    share: float  # its weight when devices are contended (mxq.shares)
    max_devices: int | None  # at most this many devices at once; None: no quota


class TokenUser(TypedDict):
    """The user a token id names, with the hash to check the token against (inside mxq only)."""

    name: str
    role: Role
    token_hash: str


def _record(row: User) -> UserRecord:
    return {"name": row.name, "role": row.role, "has_token": row.token_id is not None,
            "created_at": iso(row.created_at), "share": row.share, "max_devices": row.max_devices}


def _get(session: Session, name: str) -> User:
    """A current user's row (NotFound for a name no user has, or a removed user's)."""
    row = session.get(User, name)
    if row is None or row.removed_at is not None:
        known = ", ".join(session.scalars(select(User.name).where(User.removed_at.is_(None))
                                          .order_by(User.name))) or "none"
        raise NotFound(f"unknown user {name!r}; users: {known}")
    return row


def _retired(name: str, row: User) -> Conflict:
    return Conflict(f"user {name!r} was removed on {iso(row.removed_at)}; what it owned stays its "
                    "own, so its name is not given to anyone again: choose another name")


def add(url: str, name: str, role: Role, share: Share = Share()) -> str:
    """Add a user with a fresh token and its fair share; the token (shown once: only its hash is
    kept)."""
    token_id, token, token_hash = tokens.issue()
    try:
        with session_scope(url) as session:
            if (old := session.get(User, name)) is not None and old.removed_at is not None:
                raise _retired(name, old)
            session.add(User(name=name, role=role.value, token_id=token_id, token_hash=token_hash,
                             share=share.weight, max_devices=share.max_devices))
    except IntegrityError:
        raise Conflict(f"a user named {name!r} exists already; `mxq users set {name} "
                       "--new-token` gives it another token") from None
    return token


def list_users(url: str) -> list[UserRecord]:
    with session_scope(url) as session:
        return [_record(u) for u in session.scalars(select(User).where(User.removed_at.is_(None))
                                                    .order_by(User.name))]


def set_user(url: str, name: str, role: Role | None = None, new_token: bool = False,
             weight: float | None = None, max_devices: int | None = None) -> str | None:
    """Change a user's role, weight or quota (`max_devices` 0: none), and with `new_token`
    replace its token (the old one stops working); the new token, or None."""
    issued = tokens.issue() if new_token else None
    with session_scope(url) as session:
        row = _get(session, name)
        if role is not None:
            row.role = role.value
        if weight is not None:
            row.share = weight
        if max_devices is not None:
            row.max_devices = max_devices or None
        if issued is not None:
            if row.name == TOKEN_ADMIN:
                raise Conflict(f"user {TOKEN_ADMIN!r} authenticates with MXQ_API_TOKEN; "
                               "change that setting to change its token")
            row.token_id, row.token_hash = issued[0], issued[2]
    return issued[1] if issued is not None else None


def remove(url: str, name: str) -> None:
    """Remove a user: its token and its dashboard sessions stop working, it leaves its teams,
    and nothing acts in its name any more: its schedules stop firing and the webhook endpoints
    it added stop sending (both paused, in the same transaction; `owned_by_removed` keeps them
    so if resumed). The row stays, marked removed: what it owns keeps its name as owner, and no
    user added later under that name may act as its owner."""
    with session_scope(url) as session:
        row = _get(session, name)
        row.removed_at, row.token_id, row.token_hash = utcnow(), None, None
        session.execute(delete(TeamMember).where(TeamMember.user == name))
        session.execute(delete(LoginSession).where(LoginSession.user == name))
        session.execute(update(Schedule).where(Schedule.owner == name).values(enabled=False))
        session.execute(update(Hook).where(Hook.owner == name).values(enabled=False))


def owned_by_removed(owner: InstrumentedAttribute[str | None]) -> ColumnElement[bool]:
    """Whether `owner` (a schedule's, an endpoint's column) names a removed user: what acts in
    a user's name stops with the user, even if paused things were resumed."""
    return exists().where(User.name == owner, User.removed_at.is_not(None))


def by_token_id(url: str, token_id: str) -> TokenUser | None:
    with session_scope(url) as session:
        row = session.scalar(select(User).where(User.token_id == token_id))
        if row is None or row.token_hash is None:
            return None
        return {"name": row.name, "role": Role(row.role), "token_hash": row.token_hash}


def token_admin_role(url: str) -> Role | None:
    """The role of the user MXQ_API_TOKEN is the token of (`admin`, unless changed or removed)."""
    with session_scope(url) as session:
        row = session.get(User, TOKEN_ADMIN)
        if row is None or row.removed_at is not None or row.token_id is not None:
            return None
        return Role(row.role)


def role_of(url: str, name: str) -> Role | None:
    """A current user's role; None for a name no current user has (a removed user's, a
    `local:` owner's)."""
    with session_scope(url) as session:
        row = session.get(User, name)
        return Role(row.role) if row is not None and row.removed_at is None else None


def with_tokens(url: str) -> int:
    """How many users have a token of their own: any, and the API asks every write for one."""
    with session_scope(url) as session:
        return int(session.scalar(select(func.count()).select_from(User)
                                  .where(User.token_id.is_not(None))) or 0)
