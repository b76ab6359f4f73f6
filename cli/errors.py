"""Known failures become one line on stderr and an exit status, never a traceback."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError, ProgrammingError

from mxq.errors import JobRejected, MxqError

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
    if isinstance(exc, ValidationError):
        return settings_message(exc)
    if isinstance(exc, OperationalError | ProgrammingError):
        reason = str(exc.orig or exc).strip().splitlines()[0]
        if "no such table" in reason or "does not exist" in reason or "unable to open" in reason:
            return (f"database error: {reason}: the database has no mxq schema yet; "
                    "run `mxq migrate` (or `mxq up`)")
        return f"database error: {reason}"
    return None
