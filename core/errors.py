"""The failures mxq expects, by what the caller can do about them.

Every module raises one of these (or a subclass naming its own case); the API maps them to an
HTTP status in one place (`mxq.api.app`), the CLI to an exit status in one place
(`mxq.cli.errors`). The message is one line for the user: what, which value, what is allowed.
A failure outside this hierarchy is a bug: the CLI shows its traceback, the API answers 500.
"""

from __future__ import annotations

import re
from typing import Any


class MxqError(Exception):
    """Base of the expected failures."""

    def details(self) -> dict[str, Any]:
        """Fields beside the message that callers rely on (the API adds them to its body)."""
        return {}


class UserError(MxqError, ValueError):
    """The request is wrong: a bad parameter, path, device or shape. API 422, exit 2."""


class NotFound(MxqError, LookupError):
    """No such job, model, version or schedule; the message lists what exists. API 404, exit 2."""


class Conflict(MxqError):
    """It exists already (a schedule name, a model version). API 409, exit 2."""


class Unavailable(MxqError):
    """A server mxq needs is down or unreachable (broker, database, the stack). API 503, exit 2."""


class JobRejected(UserError):
    """The request was recorded as a failed job (its parameters or input are wrong): API 422
    with the job's id, exit 1 as a failed job's `--wait` does."""

    def __init__(self, job_id: int, reason: str) -> None:
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id = job_id

    def details(self) -> dict[str, Any]:
        return {"job_id": self.job_id}


class Unauthorized(MxqError):
    """A request without a token or with a wrong one (API 401): what `mxq.client` raises for it.
    `Forbidden` (a 403) is its subclass, so `except Unauthorized` still catches both."""


class Forbidden(Unauthorized):
    """The caller is known but its role does not allow this (a `read` user's submit, another
    user's cancel): API 403."""


class DeviceFault(RuntimeError):
    """The device failed (a CUDA, cuDNN or NVML error, ONNX Runtime without the device's provider),
    not the job's input: the job goes back to its queue without using an attempt, and the device's
    worker stops until the device passes its start check again (`mxq.tasks.runner`).

    `devices`: the job's devices the fault came from, where that is known (an error that names
    its context); empty when not, and then every device of the job is suspect."""

    def __init__(self, message: str, devices: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.devices = devices


# How MXNet names a context in its messages (`gpu(1)`): the device a fault came from, when said.
_CONTEXT = re.compile(r"\bgpu\((\d+)\)")


def named_device(text: str, devices: list[str]) -> str | None:
    """The one device of `devices` (a process's contexts 0..K-1, in order) that `text` names as
    `gpu(i)`; None when it names none, several, or one out of range."""
    named = {int(i) for i in _CONTEXT.findall(text)}
    if len(named) != 1 or (index := named.pop()) >= len(devices):
        return None
    return devices[index]


# What MXNet 1.9.1 and ONNX Runtime say when the device failed, not the model: CUDA, cuDNN,
# cuBLAS, NCCL and NVML errors, a GPU they cannot see or use.
DEVICE_FAULT = re.compile(r"CUDA|cuda[A-Z]|cuDNN|CUDNN|cuBLAS|CUBLAS|NCCL|NVML|GPU usage requires"
                          r"|GPU is not enabled|no CUDA-capable device|CUDA driver")

# ... but these are the model's, on any healthy GPU: an operator the build has no GPU kernel for
# (MXNet's "Operator X is not implemented for GPU"), and what the Kubernetes device plugin counts
# as the application's Xids (13 and 31: an illegal or misaligned address, an illegal instruction,
# a device-side assert): taken for faults, one such job took healthy GPU after GPU out.
MODEL_FAULT = re.compile(r"not implemented for GPU|illegal memory access|illegal address"
                         r"|misaligned address|illegal instruction|device-side assert", re.IGNORECASE)


# ... but running out of memory is not: the job's batch or model is too big for the device, which
# the job handles itself (mxq.tasks.runtimes.oom: a batch halved, or the job fails saying so).
OUT_OF_MEMORY = re.compile(r"out of memory|alloc_failed|memoryallocation|bad_alloc|failed to allocate",
                           re.IGNORECASE)


def device_fault(exc: BaseException) -> bool:
    """Whether `exc` is the device's fault: a DeviceFault, or an error whose message is one of
    the CUDA stack's (DEVICE_FAULT) other than running out of memory or the model's own
    (MODEL_FAULT)."""
    text = str(exc)
    return isinstance(exc, DeviceFault) or (bool(DEVICE_FAULT.search(text))
                                            and not OUT_OF_MEMORY.search(text)
                                            and not MODEL_FAULT.search(text))


def reason(exc: BaseException, limit: int = 300) -> str:
    """The line of an exception's message that says what happened: MXNet's carry a traceback
    ("Traceback (most recent call last):", "[bt] (0) ...", "File ...") before their last line."""
    frames = ("Traceback (most recent call last)", "[bt]", "File ", "Stack trace")
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(frames)]
    return ((said or lines or [type(exc).__name__])[-1])[:limit]


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (its type's name when it has none): drivers and
    libraries (psycopg, redis, SQLAlchemy, ONNX Runtime) say what happened first and add SQL,
    parameters, hints or a help link below it, the other way round from MXNet (`reason`)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


def typed_line(exc: BaseException, limit: int = 500) -> str:
    """`Type: first line` of an unexpected exception, as a failed job records it (the type is
    the clue when the message alone is not: a bare `KeyError: 'samples'`); the type alone when it
    has no message."""
    return f"{type(exc).__name__}: {first_line(exc, limit)}" if str(exc).strip() else type(exc).__name__
