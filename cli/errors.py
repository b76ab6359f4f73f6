"""Known failures become one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from workers.devices import DeviceError
from workers.jobspecs import ParamsError
from workers.queues import DeviceSpecError
from workers.routing import RoutingError
from workers.stack import StackError
from workers.submit import SubmitError

USER_ERRORS = (SubmitError, RoutingError, DeviceSpecError, ParamsError, DeviceError, StackError)
EXIT_USAGE = 2


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


def describe(exc: BaseException) -> str | None:
    """The one-line message for a known failure, or None for a real bug."""
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    if isinstance(exc, ValidationError):
        return settings_message(exc)
    if isinstance(exc, OperationalError):
        return f"database error: {str(exc.orig or exc).strip().splitlines()[0]}"
    return None
