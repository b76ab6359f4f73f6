"""The job kinds and their parameters' models: `SPECS`, the table from a kind (`JobKind`) to the
model its jobs are validated, stored and run with, and `validate`, which reads a kind's parameters
from JSON (at the edge: a CLI command's options, a stored row).

Each kind's model lives with its submit-time checks (workers/jobs/kinds/probe.py, infer.py, train.py,
register.py, arch.py), what they share in workers/jobs/kinds/params.py; this module re-exports the
names the task bodies import.
"""

from __future__ import annotations

from typing import TypeAlias

from mxq.json_types import JsonMapping
from mxq.status import JobKind
from mxq.workers.jobs.kinds.arch import ARCHS, FACTORY_PATTERN, MAX_ARCH_BYTES, MAX_ARCH_NAME, ArchParams
from mxq.workers.jobs.kinds.infer import AUTO_BATCH_START, InferParams, InferRequest
from mxq.workers.jobs.kinds.params import (
    P,
    ParamsError,
    Rejected,
    Spec,
    TimeLimited,
    requested,
    stored,
    validated,
)
from mxq.workers.jobs.kinds.probe import CONV_FILTERS, CONV_KERNEL, CONV_SHAPE, ProbeParams, probe_flops
from mxq.workers.jobs.kinds.register import RegisterParams, parse_heads
from mxq.workers.jobs.kinds.train import BUILTIN_DATASETS, DistRole, TrainOptions, TrainParams, TrainRequest
from mxq.workers.settings import Limits

__all__ = ["ARCHS", "AUTO_BATCH_START", "BUILTIN_DATASETS", "CONV_FILTERS", "CONV_KERNEL", "CONV_SHAPE",
           "FACTORY_PATTERN", "MAX_ARCH_BYTES", "MAX_ARCH_NAME", "SPECS", "ArchParams", "DistRole",
           "InferParams", "InferRequest", "JobParams", "JobRequest", "P", "ParamsError",
           "ProbeParams", "RegisterParams", "Rejected", "TimeLimited", "TrainOptions", "TrainParams",
           "TrainRequest", "kind_of", "parse_heads", "probe_flops", "request_of", "requested", "stored",
           "validate", "validated"]

# A job's parameters, typed: what `validate` returns and every step after it passes on, from the
# submit to the task body. They become JSON once, where they are stored (SQL) and read back from it.
JobParams: TypeAlias = ProbeParams | InferParams | TrainParams | RegisterParams | ArchParams
# What a submit takes: a kind's request as a user gives it (`mxq infer`, the API's body) or its
# parameters as mxq makes them (a schedule's fire, a registration, an architecture's trial).
JobRequest: TypeAlias = ProbeParams | InferRequest | TrainRequest | RegisterParams | ArchParams
SPECS: dict[JobKind, type[JobParams]] = {
    JobKind.PROBE: ProbeParams, JobKind.INFER: InferParams, JobKind.TRAIN: TrainParams,
    JobKind.REGISTER: RegisterParams, JobKind.ARCH: ArchParams}


def kind_of(request: Spec) -> JobKind:
    """The kind of job a request or a job's parameters are for."""
    return request.job_kind


def known_kind(kind: str) -> JobKind:
    """`kind` as a JobKind, or ParamsError listing the known kinds."""
    try:
        return JobKind(kind)
    except ValueError:
        raise ParamsError(f"unknown job kind {kind!r}; known kinds: {', '.join(SPECS)}") from None


def validate(kind: JobKind | str, params: JsonMapping, limits: Limits | None = None) -> JobParams:
    """The typed parameters of a job of `kind`, defaults filled in, or ParamsError saying what
    is wrong. Size limits come from `limits` (default: the process settings')."""
    return validated(SPECS[known_kind(kind)], params, limits)


def request_of(kind: JobKind, options: JsonMapping, limits: Limits) -> JobParams | Rejected:
    """Options given as JSON (a script's, a bench's, a stored schedule's) as a job of `kind`, or
    the Rejected request a submit records as a failed job (`validate`, within `limits`)."""
    try:
        return validate(kind, options, limits)
    except ParamsError as exc:
        return Rejected(kind, options, str(exc))
