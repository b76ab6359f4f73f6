"""Known failures become one line on stderr and an exit status, never a traceback."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from mxq.errors import JobRejected, MxqError

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_USAGE = 2
EXIT_JOB_FAILED = 1


def settings_message(exc: ValidationError) -> str:
    """`MXQ_FIELD=value: reason` for each bad setting."""
    parts = []
    for e in exc.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if msg.startswith("MXQ_"):
            parts.append(msg)
        else:
            field = "MXQ_" + "_".join(map(str, e["loc"])).upper()
            parts.append(f"{field}={e.get('input')!r}: {msg}")
    return "invalid settings: " + "; ".join(parts)


def exit_code(exc: BaseException) -> int:
    """The one place an expected failure (mxq.errors) becomes an exit status: a request recorded
    as a failed job exits as a failed job does, every other expected failure as a usage error."""
    return EXIT_JOB_FAILED if isinstance(exc, JobRejected) else EXIT_USAGE


def describe(exc: BaseException) -> str | None:
    """The one-line message for a known failure, or None for a real bug."""
    if isinstance(exc, MxqError):
        return str(exc)
    # A pydantic or SQLAlchemy error can only come from a command that imported them; asking
    # otherwise would import them for nothing (tests/test_cli_start.py).
    if "pydantic" in sys.modules:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            return settings_message(exc)
    if "sqlalchemy" in sys.modules:
        return _database_message(exc)
    return None


def _database_message(exc: BaseException) -> str | None:
    from sqlalchemy.exc import OperationalError, ProgrammingError

    if isinstance(exc, OperationalError | ProgrammingError):
        reason = str(exc.orig or exc).strip().splitlines()[0]
        if "no such table" in reason or "does not exist" in reason or "unable to open" in reason:
            return (f"database error: {reason}: the database has no mxq schema yet; "
                    "run `mxq migrate` (or `mxq up`)")
        return f"database error: {reason}"
    return None
