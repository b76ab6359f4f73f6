"""Teams (mxq.users): a user belongs to several; what is shared with a team is read by its
members. Also what a stored owner may do now (`rights_of`): a schedule's fire, a training's
registration and a promotion check the owner's rights when they act, not only when asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mxq.db.engine import session_scope
from mxq.db.schema import Team, TeamMember, User, iso
from mxq.errors import Conflict, Forbidden, NotFound, UserError
from mxq.names import shown
from mxq.users import Role, is_local, may_manage_model


class TeamRecord(TypedDict):
    """One team (`mxq teams ls --json`)."""

    name: str
    members: list[str]
    created_at: str | None


@dataclass(frozen=True)
class Rights:
    """What a user may do: its role and its teams."""

    name: str
    role: Role | None  # None: no current user (removed, unknown): it may do nothing
    teams: frozenset[str] = frozenset()

    def may_manage_model(self, owner: str | None, team: str | None) -> bool:
        return self.role is not None and may_manage_model(self.role, self.name, self.teams, owner, team)


def add_team(url: str, name: str) -> None:
    try:
        with session_scope(url) as session:
            session.add(Team(name=name))
    except IntegrityError:
        raise Conflict(f"a team named {name!r} exists already") from None


def remove_team(url: str, name: str) -> None:
    """Remove a team: what was shared with it is its owners' (and admins') alone again."""
    with session_scope(url) as session:
        _team(session, name)
        session.execute(delete(TeamMember).where(TeamMember.team == name))
        session.execute(delete(Team).where(Team.name == name))


def _team(session: Session, name: str) -> Team:
    row = session.get(Team, name)
    if row is None:
        known = ", ".join(session.scalars(select(Team.name).order_by(Team.name))) or "none"
        raise NotFound(f"unknown team {name!r}; teams: {known}")
    return row


def set_member(url: str, team: str, user: str, member: bool = True) -> None:
    """Add `user` to `team` (or, with member False, take it out)."""
    with session_scope(url) as session:
        _team(session, team)
        row = session.get(User, user)
        if row is None or row.removed_at is not None:
            raise NotFound(f"unknown user {user!r}")
        session.execute(delete(TeamMember).where(TeamMember.team == team, TeamMember.user == user))
        if member:
            session.add(TeamMember(team=team, user=user))


def list_teams(url: str) -> list[TeamRecord]:
    with session_scope(url) as session:
        members: dict[str, list[str]] = {}
        for team, user in session.execute(select(TeamMember.team, TeamMember.user)
                                          .order_by(TeamMember.user)):
            members.setdefault(team, []).append(user)
        return [{"name": t.name, "members": members.get(t.name, []), "created_at": iso(t.created_at)}
                for t in session.scalars(select(Team).order_by(Team.name))]


def teams_of(url: str, user: str) -> frozenset[str]:
    with session_scope(url) as session:
        return frozenset(session.scalars(select(TeamMember.team).where(TeamMember.user == user)))


def rights_of(url: str, owner: str) -> Rights:
    """What `owner` (a stored owner: a user's name, `local:…`) may do now."""
    if is_local(owner):
        return Rights(owner, Role.ADMIN)
    with session_scope(url) as session:
        row = session.get(User, owner)
        if row is None or row.removed_at is not None:
            return Rights(owner, None)
        teams = frozenset(session.scalars(select(TeamMember.team).where(TeamMember.user == owner)))
        return Rights(owner, Role(row.role), teams)


def check_team(url: str, team: str | None, owner: str) -> str | None:
    """The team a job, schedule or model is shared with: one that exists and that its owner
    belongs to (an admin may name any); None stays None (the owner alone)."""
    if team is None:
        return None
    rights = rights_of(url, owner)
    with session_scope(url) as session:
        if session.get(Team, team) is None:
            known = ", ".join(session.scalars(select(Team.name).order_by(Team.name))) or "none"
            raise UserError(f"--team {shown(team)}: no such team; teams: {known} (`mxq teams add`)")
    if rights.role is not Role.ADMIN and team not in rights.teams:
        raise Forbidden(f"user {rights.name!r} is not a member of team {team!r}: it may share only "
                        f"with its own teams ({', '.join(sorted(rights.teams)) or 'none'})")
    return team
