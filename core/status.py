"""A job's kind and status and a webhook delivery's status: the values stored in SQL, shown by the
CLI and the API; and what a job that waits for others (`--after`) does given theirs."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobKind(enum.StrEnum):
    """What a job does: its task is `mxq.<kind>` and its parameters the kind's model
    (workers/jobs/)."""

    PROBE = "probe"
    INFER = "infer"
    TRAIN = "train"
    REGISTER = "register"  # a model version's registration (checks, ONNX export)
    ARCH = "arch"  # a user architecture's trial run


class DeliveryStatus(enum.StrEnum):
    """A webhook delivery's state: failed ones are retried at their next attempt; gave_up is final."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    GAVE_UP = "gave_up"


FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)  # a job ends in one
UNSUCCESSFUL = (JobStatus.FAILED, JobStatus.CANCELLED)  # ended without its result (the CLI exits 1)


# `--after`: the most jobs one job may wait for (Slurm's afterok takes a list too; a longer one is
# a pipeline better expressed as a chain), and what a waiting job does given their outcomes.
MOST_AFTER = 64
MOST_AFTER_LISTED = 16 * MOST_AFTER  # entries of one `--after` list, repeats included (each counts once)
SHOWN_ERROR_CHARS = 200  # of a failed job's error, in the error of a job that waited for it


@dataclass(frozen=True)
class AfterVerdict:
    """What a job waiting for its `--after` jobs does now: go (neither field set), keep waiting
    for `waits_for` (the first of them not finished), or fail with `error` (one of them failed,
    was cancelled or was removed: it can never succeed, so the job can never run)."""

    waits_for: int | None = None
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.waits_for is None and self.error is None


def after_verdict(after: Sequence[int], outcomes: Mapping[int, tuple[str, str | None]]) -> AfterVerdict:
    """The verdict for a job waiting for `after`, given each one's (status, error) as stored
    (an id missing from `outcomes` was removed). One that cannot succeed decides at once, even
    while others still run: the job fails now rather than after them."""
    for job_id in after:
        if job_id not in outcomes:
            return AfterVerdict(error=f"job {job_id} it waits for (--after) was removed")
        status, error = outcomes[job_id]
        if status == JobStatus.FAILED:
            lines = (error or "").strip().splitlines()
            line = lines[0] if lines else "no error recorded"
            if len(line) > SHOWN_ERROR_CHARS:
                line = line[:SHOWN_ERROR_CHARS] + "…"
            return AfterVerdict(error=f"job {job_id} it waits for (--after) failed: {line}")
        if status == JobStatus.CANCELLED:
            return AfterVerdict(error=f"job {job_id} it waits for (--after) was cancelled")
    return AfterVerdict(waits_for=next((j for j in after if outcomes[j][0] != JobStatus.SUCCEEDED), None))
