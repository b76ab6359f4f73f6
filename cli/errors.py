"""Known failures become one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError, ProgrammingError

from mxq.cli.models import ShapeError
from mxq.db.registry import ModelNotFound
from mxq.db.schedules import ScheduleError, ScheduleExists
from mxq.workers.cancel import CancelError
from mxq.workers.cron import CronError
from mxq.workers.devices import DeviceError
from mxq.workers.jobspecs import ParamsError
from mxq.workers.paths import PathError
from mxq.workers.queues import DeviceSpecError
from mxq.workers.routing import RoutingError
from mxq.workers.stack import StackError
from mxq.workers.submit import JobRejected, SubmitError

USER_ERRORS = (SubmitError, RoutingError, DeviceSpecError, ParamsError, DeviceError, StackError,
               ShapeError, ModelNotFound, PathError, ScheduleError, CronError, CancelError, ScheduleExists)
# Errors of modules that load MXNet, matched by name so importing the CLI never loads it.
LAZY_ERRORS = ("ModelError", "ArchError")
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
    return EXIT_JOB_FAILED if isinstance(exc, JobRejected) else EXIT_USAGE


def describe(exc: BaseException) -> str | None:
    """The one-line message for a known failure, or None for a real bug."""
    if isinstance(exc, USER_ERRORS) or type(exc).__name__ in LAZY_ERRORS:
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
