"""Users, roles and teams: who may do what through the API.

- `read`: history, models, devices, schedules, and the results of what its teams own;
- `submit`: also submits jobs, adds schedules, and cancels, pauses, resumes, fires and removes
  its own (the ones it owns); registers and promotes versions of the models it or its teams own;
- `admin`: everything, anyone's jobs, results, schedules and models, and users and teams.

What a job produces (its results, predictions, output files) is read by its owner, by the
members of the team it was shared with (`--team`), and by admins; the history row itself is
visible to every user (`may_read`).

Every job, schedule and fire records its owner: a user's name; `admin` for the single
MXQ_API_TOKEN (the admin user migration 0018 made); `local:<login>` for the CLI on the stack's
own machine, which acts as an admin; `local:api` for the API when it has no token at all (it
then listens on loopback only).
"""

from __future__ import annotations

import enum
import getpass
import re

USER_NAME = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")
# The admin user migration 0018 made: MXQ_API_TOKEN, when set, is its token.
TOKEN_ADMIN = "admin"
LOCAL_API = "local:api"


class Role(enum.StrEnum):
    READ = "read"
    SUBMIT = "submit"
    ADMIN = "admin"


def check_name(name: str, what: str = "user name") -> str:
    """A user or team name: lower-case letters, digits, `.`, `_` and `-`, starting with a letter."""
    if not USER_NAME.match(name):
        raise ValueError(f"{what} {name!r}: expected 1 to 64 of a-z 0-9 . _ - starting with a letter")
    return name


def is_local(owner: str) -> bool:
    """An owner that is this machine's command line (`local:<login>`) or the token-less API:
    an admin by construction (whoever runs them can read the database anyway)."""
    return owner.startswith("local:")


def local_owner() -> str:
    """The owner a command run on the stack's own machine records: `local:<login>`."""
    try:
        login = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        login = "unknown"
    return f"local:{login}"


def may_submit(role: Role) -> bool:
    return role in (Role.SUBMIT, Role.ADMIN)


def may_change(role: Role, user: str, owner: str | None) -> bool:
    """May `user` (of `role`) cancel a job, or change a schedule, that `owner` owns?"""
    return role is Role.ADMIN or (role is Role.SUBMIT and owner == user)


def may_read(role: Role, user: str, teams: frozenset[str], owner: str | None,
             team: str | None) -> bool:
    """May `user` (of `role`, member of `teams`) read the results of what `owner` owns, shared
    with `team`? Its owner, the team's members, admins; a thing without an owner (from before
    users) is the admins' alone."""
    return (role is Role.ADMIN or (owner is not None and owner == user)
            or (team is not None and team in teams))


def may_manage_model(role: Role, user: str, teams: frozenset[str], owner: str | None,
                     team: str | None) -> bool:
    """May `user` register and promote versions of a model that `owner` owns, shared with
    `team`? An admin; a `submit` user that owns it or is of its team. A model without an owner
    (registered before sharing existed) is the admins' alone."""
    return role is Role.ADMIN or (role is Role.SUBMIT and may_read(role, user, teams, owner, team))
