"""Known failures become one line on stderr and an exit status, never a traceback."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from mxq.errors import JobRejected, MxqError

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_USAGE = 2
EXIT_JOB_FAILED = 1


# Longest setting value repeated in an error: a 400-digit number is named by its start.
MAX_SHOWN = 60


def _shown(value: object, field: str) -> str:
    """The value as the shell gave it, on one line, shortened, never a secret's."""
    if field == "api_token":
        return "(hidden)"
    text = str(value)
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        text = repr(text)
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}… ({len(text)} characters)"


def settings_message(exc: ValidationError) -> str:
    """`MXQ_FIELD=value: reason (allowed: range)` for each bad setting, on one line: the
    validators' own messages start with the setting's name and are kept as they are."""
    from mxq.workers.settings import allowed

    parts = []
    for e in exc.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if msg.startswith("MXQ_"):
            parts.append(msg)
            continue
        field = "_".join(map(str, e["loc"]))
        bounds = allowed(field)
        parts.append(f"MXQ_{field.upper()}={_shown(e.get('input'), field)}: {msg}"
                     + (f" (allowed: {bounds})" if bounds else ""))
    return " ".join("; ".join(parts).split())


def exit_code(exc: BaseException) -> int:
    """The one place an expected failure (mxq.errors) becomes an exit status: a request recorded
    as a failed job exits as a failed job does, every other expected failure as a usage error."""
    return EXIT_JOB_FAILED if isinstance(exc, JobRejected) else EXIT_USAGE


def describe(exc: BaseException) -> str | None:
    """The one-line message for a known failure, or None for a real bug."""
    if isinstance(exc, MxqError):
        return str(exc)
    # A pydantic or SQLAlchemy error can only come from a command that imported them; asking
    # otherwise would import them for nothing (tests/house/test_cli_start.py).
    if "pydantic" in sys.modules:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            return settings_message(exc)
    if "sqlalchemy" in sys.modules:
        from mxq.db.errors import describe as database_error

        return database_error(exc)
    return None
