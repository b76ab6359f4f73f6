"""What a name or an id from outside may be.

Names become paths (a model's name is a folder of the model store): letters, digits, `_`, `.`
and `-`, 1 to 128 of them, not starting with `.` or `-`, so that no name is `..`, a hidden file,
an absolute path or a command-line flag. Ids and offsets are at most what PostgreSQL's `integer`
holds (jobs.id and the other ids are INTEGER), so that no number from outside reaches the
database as an overflow."""

from __future__ import annotations

import re

from mxq.errors import UserError

MAX_ID = 2**31 - 1
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)


class BadName(UserError):
    """A name that breaks the rule."""


def check_name(name: str, what: str = "model name") -> str:
    """`name` if it follows the rule, else a one-line error naming it and the rule."""
    if not _NAME.fullmatch(name):
        shown = repr(name) if len(name) <= 80 else f"{name[:80] + '…'!r} ({len(name)} characters)"
        raise BadName(f"{what} {shown} is not allowed: use 1 to 128 letters, digits, '_', "
                         "'.' or '-', starting with a letter, digit or '_'")
    return name
