"""Ride out short outages: retry an operation on transient errors, with capped backoff.

Worker-side database writes (`db_retry`) and broker calls use it, so a database restart or a
Redis restart of a few seconds costs the running jobs a pause, not a failure. Every retried
operation is one whole transaction (or one idempotent broker call), so running it again is safe.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

from mxq import errors
from mxq.errors import Unavailable

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

# An outage shorter than this is ridden out; after it the error is raised as it is.
RETRY_SECONDS = 120.0
FIRST_DELAY, MAX_DELAY = 0.2, 5.0
# SQLite reports a broken schema as an OperationalError too; those never heal by waiting.
PERMANENT_HINTS = ("no such table", "no such column", "syntax error")


def transient_db_error(exc: BaseException) -> bool:
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    return isinstance(exc, (OperationalError, InterfaceError)) and \
        not any(h in str(exc) for h in PERMANENT_HINTS)


class DatabaseUnreachable(Unavailable):
    """The database stayed unreachable for the whole retry window: one line naming where and for
    how long, with the driver's own first line (a job's error, an API 503), instead of
    SQLAlchemy's several lines of SQL, parameters and help link."""


def first_line(exc: BaseException) -> str:
    """The driver's first line (`exc.orig` for a SQLAlchemy error), without SQLAlchemy's text."""
    return errors.first_line(getattr(exc, "orig", None) or exc)


def _where(url: object) -> str:
    """host:port of a database URL (a SQLite file's path), never its password."""
    try:
        u = make_url(str(url))
    except ArgumentError:
        return "the database"
    if u.host:
        return f"{u.host}:{u.port}" if u.port else u.host
    return u.database or str(u.drivername)


def unreachable(exc: BaseException, args: tuple[object, ...], seconds: float) -> BaseException:
    """What a database operation raises once its retry window is spent (its first argument is
    the database URL, as every `db_retry` operation's is)."""
    where = _where(args[0]) if args else "the database"
    return DatabaseUnreachable(f"database unreachable at {where} for {seconds:g} s: "
                               f"{first_line(exc)}")


def retrying(transient: Callable[[BaseException], bool], seconds: float = RETRY_SECONDS,
             give_up: Callable[[BaseException, tuple[object, ...], float], BaseException] | None = None,
             ) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate an operation so that errors `transient` accepts are retried for `seconds`; past
    them `give_up` (when given) turns the last error into the one raised."""
    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            deadline, delay, tries = time.monotonic() + seconds, FIRST_DELAY, 0
            while True:
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    if not transient(exc):
                        raise
                    if time.monotonic() + delay > deadline:
                        if give_up is None:
                            raise
                        raise give_up(exc, tuple(args), seconds) from exc
                    tries += 1
                    reason = errors.first_line(exc, 200)
                    log.warning("%s failed (%s); retry %s in %.1fs", fn.__qualname__, reason,
                                tries, delay)
                    time.sleep(delay)
                    delay = min(delay * 2, MAX_DELAY)
        return wrapper
    return decorate


db_retry = retrying(transient_db_error, give_up=unreachable)
