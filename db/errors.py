"""SQL errors in mxq's words, so that no layer above `mxq.db` imports SQLAlchemy.

A statement raises SQLAlchemy's `OperationalError` when the database is down or unreachable, or
(on SQLite) has no mxq schema yet. The API answers it with a 503 whose detail is `unavailable`,
`/metrics` with `mxq_database_up 0`, and the CLI prints `describe`'s one line for it.
"""

from __future__ import annotations

import re

from sqlalchemy.exc import OperationalError, ProgrammingError

from mxq.db.retry import first_line

# What a database that cannot answer raises: a tuple to catch (`except DATABASE_UNAVAILABLE:`) and
# to register an error handler for, so that a caller needs no SQLAlchemy class of its own.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError,)


def unavailable(exc: BaseException) -> str | None:
    """`database unavailable: <the driver's first line>` for a database that could not answer,
    else None (not a database's error)."""
    return f"database unavailable: {first_line(exc)}" if isinstance(exc, OperationalError) else None


def describe(exc: BaseException) -> str | None:
    """A command's one line for a database error, with what to do about it (create the database,
    run `mxq migrate`), else None (not a database's error)."""
    if not isinstance(exc, OperationalError | ProgrammingError):
        return None
    reason = first_line(exc)
    missing = re.search(r'database "([^"]+)" does not exist', reason)
    if missing:  # the server answered: the database itself is absent, not its schema
        name = missing.group(1)
        return (f'database error: the PostgreSQL database "{name}" does not exist: create it '
                f'(`createdb {name}` or CREATE DATABASE "{name}"), then run `mxq migrate`')
    if "no such table" in reason or "does not exist" in reason or "unable to open" in reason:
        return (f"database error: {reason}: the database has no mxq schema yet; "
                "run `mxq migrate` (or `mxq up`)")
    return f"database error: {reason}"
