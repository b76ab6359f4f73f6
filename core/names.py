"""What a name or an id from outside may be.

Names become paths (a model's name is a folder of the model store): letters, digits, `_`, `.`
and `-`, 1 to 128 of them, not starting with `.` or `-`, so that no name is `..`, a hidden file,
an absolute path or a command-line flag. Ids and offsets are at most what PostgreSQL's `integer`
holds (jobs.id and the other ids are INTEGER), so that no number from outside reaches the
database as an overflow. And text from outside leaves in a CSV cell as text, never as a
spreadsheet formula (`csv_cell`), and on a terminal as characters, never as its commands
(`visible`)."""

from __future__ import annotations

import re
from typing import TypeVar

from mxq.errors import UserError

T = TypeVar("T")

MAX_ID = 2**31 - 1
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)


# What a terminal would act on rather than show: C0 (an escape sequence's ESC, a carriage return,
# a tab), DEL, C1, the Unicode line and paragraph separators, and the bidirectional overrides
# and isolates that reorder what is shown.
_TERMINAL_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """`text` as a terminal should show it: each control character as its escape (`\\x1b`),
    so a file name from outside can neither move the cursor, recolour nor clear the screen."""
    return _TERMINAL_CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


class BadName(UserError):
    """A name that breaks the rule."""


def check_name(name: str, what: str = "model name") -> str:
    """`name` if it follows the rule, else a one-line error naming it and the rule."""
    if not _NAME.fullmatch(name):
        shown = repr(name) if len(name) <= 80 else f"{name[:80] + '…'!r} ({len(name)} characters)"
        raise BadName(f"{what} {shown} is not allowed: use 1 to 128 letters, digits, '_', "
                         "'.' or '-', starting with a letter, digit or '_'")
    return name


# The first characters that make a spreadsheet read a cell as a formula (OWASP, "CSV Injection"):
# `=`, `+`, `-`, `@`, and a tab or carriage return, which some skip before one.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: T) -> T | str:
    """`value` as a CSV cell that a spreadsheet shows and never runs: a string starting like a
    formula gets a leading `'` (a model name `=HYPERLINK(...)` of a refused submit would
    otherwise open a link, or run a command, in whoever opens `mxq jobs --format csv`). Only
    strings: a number (-0.5, -3) stays a number. Every CSV mxq writes calls it, cell by cell."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


# The most of a refused value a one-line message echoes: enough to recognise it, never a
# megabyte back.
SHOWN_CHARS = 120


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A refused value as a message names it: its repr, cut to `limit` characters with its length."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
