"""A job's status: the values stored in SQL, shown by the CLI and the API."""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)  # a job ends in one
UNSUCCESSFUL = (JobStatus.FAILED, JobStatus.CANCELLED)  # ended without its result (the CLI exits 1)
