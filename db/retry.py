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

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

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


def retrying(transient: Callable[[BaseException], bool],
             seconds: float = RETRY_SECONDS) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate an operation so that errors `transient` accepts are retried for `seconds`."""
    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            deadline, delay, tries = time.monotonic() + seconds, FIRST_DELAY, 0
            while True:
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    if not transient(exc) or time.monotonic() + delay > deadline:
                        raise
                    tries += 1
                    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                    log.warning("%s failed (%s); retry %s in %.1fs", fn.__qualname__, reason,
                                tries, delay)
                    time.sleep(delay)
                    delay = min(delay * 2, MAX_DELAY)
        return wrapper
    return decorate


db_retry = retrying(transient_db_error)
