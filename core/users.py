"""Users and roles: who may do what through the API.

- `read`: history, models, devices, schedules;
- `submit`: also submits jobs, adds schedules, and cancels, pauses, resumes, fires and removes
  its own (the ones it owns);
- `admin`: everything, anyone's jobs and schedules, model promotion and users.

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


def check_name(name: str) -> str:
    """A user name: lower-case letters, digits, `.`, `_` and `-`, starting with a letter."""
    if not USER_NAME.match(name):
        raise ValueError(f"user name {name!r}: expected 1 to 64 of a-z 0-9 . _ - starting with a letter")
    return name


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
