"""The training child's report to its leader: one JSON file per attempt (`train_task.run_file`),
written by the child as it ends and read back by the leader, whose exit status says which of the
shapes it is: `Trained` (exit 0), `Stopped` (a cancel), `Preempted` (it yielded at a checkpoint)
or `Refused` (bad input, the job lost, past its time limit, a crash).

A report read back is checked against its shape: one that does not fit (cut short, edited,
written by another version of mxq) fails the job with one line naming the file and the field,
instead of a KeyError in the job frame.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from mxq.tasks.job_context import JobFailed


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Trained(_Report):
    """The training ran to its last epoch."""

    samples: int  # this worker trained on, over every epoch this attempt ran
    seconds: float  # compute time of those epochs
    result: dict[str, object]  # the job's result, free-form JSON stored as it is (model, version, metrics)


class Stopped(_Report):
    """A cancel stopped the training at a boundary; the finished epochs' checkpoints stay."""

    samples: int  # trained on in the epochs this attempt finished


class Preempted(_Report):
    """The training stopped at an epoch's checkpoint to yield its devices to the waiting job `to`."""

    samples: int  # trained on in the epochs this attempt finished
    to: int


class Refused(_Report):
    """The training ended without a model (past its time limit: its finished epochs kept)."""

    error: str  # why, in one line
    device_fault: bool = False  # the child judged its error, whole, to be the device's
    faulted: str | None = None  # which of its devices the error named (`gpu(1)`), when it did


Report = Trained | Stopped | Preempted | Refused
R = TypeVar("R", Trained, Stopped, Preempted, Refused)


class MalformedReport(JobFailed):
    """A report that is not JSON or does not fit the shape its exit status says: the job fails
    with this one line."""


def write(path: Path, report: Report) -> None:
    # json, not pydantic's serializer: a NaN loss is written as JSON's NaN, as before, not null
    path.write_text(json.dumps(report.model_dump()))


def read(path: Path, shape: type[R]) -> R | None:
    """The report at `path` as `shape`; None when the child wrote none (it was killed)."""
    if not path.exists():
        return None
    try:
        return shape.model_validate(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise MalformedReport(f"the training child's report {path.name} is not JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "the report"
        raise MalformedReport(f"the training child's report {path.name} is malformed "
                              f"(expected {shape.__name__}): {where}: {first['msg']}") from None
