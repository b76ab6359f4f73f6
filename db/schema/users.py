"""Users, teams and dashboard logins."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from mxq.db.schema.base import Base, utcnow


class User(Base):
    """A user of the API (mxq.users): a role and the scrypt hash of one token, never the token.

    `token_id` (the clear part of `mxq_<id>_<secret>`) finds the row; the `admin` row made by
    migration 0018 has none: MXQ_API_TOKEN, when set, is its token."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    token_id: Mapped[str | None] = mapped_column(String(12), unique=True)
    token_hash: Mapped[str | None] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Its fair share (mxq.shares, migration 0020): a weight against the other owners' when
    # devices are contended, and at most this many devices at once (None: no quota).
    share: Mapped[float] = mapped_column(Float, default=1.0)
    max_devices: Mapped[int | None]
    # Removed (migration 0023): the row stays, without a token, so that its name is never given
    # to another user and what it owned stays its own.
    removed_at: Mapped[datetime | None]


class Team(Base):
    """A team (mxq.users): what is shared with it is read by its members."""

    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TeamMember(Base):
    """One user in one team; a user belongs to several."""

    __tablename__ = "team_members"

    team: Mapped[str] = mapped_column(ForeignKey("teams.name", ondelete="CASCADE"), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"), primary_key=True)

    __table_args__ = (Index("ix_team_members_user", "user"),)


class LoginSession(Base):
    """A dashboard login: a token exchanged for a cookie. Only the cookie's SHA-256 is kept, with
    the CSRF token its writes must carry."""

    __tablename__ = "sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
