"""The frame every job runs in: claim it in SQL, run its body, record the outcome, then ack.

Bodies raise `JobInputError` for bad input: the job fails with that message and the worker goes
on. Any other exception also fails the job, with its type and message, never the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from db import jobs
from db.engine import session_scope
from db.jobs import Claim, Placement
from db.schema import Job
from workers import app, heartbeat
from workers.queues import parse_device, worker_name
from workers.settings import get_settings

log = logging.getLogger(__name__)


class JobInputError(ValueError):
    """The job's parameters are wrong; the message says which and what is allowed."""


@dataclass
class Outcome:
    samples: int
    seconds: float  # compute time, queue time apart
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobContext:
    id: int
    params: dict[str, Any]
    device: str  # "cpu:1"
    url: str

    def progress(self, fraction: float) -> None:
        jobs.set_progress(self.url, self.id, fraction)


Body = Callable[[JobContext], Outcome]


def _placement() -> Placement:
    s = get_settings()
    device = s.device or "cpu:0"
    spec = parse_device(device)
    return Placement(worker=worker_name(s.node, spec.kind, spec.index), node=s.node, device=device)


def run_job(job_id: int, body: Body) -> str:
    s = get_settings()
    at = _placement()
    verdict = jobs.claim(s.database, job_id, at, s.max_attempts, s.heartbeat_ttl)
    if verdict is not Claim.RUN:
        log.warning("job %s not run here: %s", job_id, verdict.value)
        return verdict.value
    with session_scope(s.database) as session:
        params = dict(session.get(Job, job_id).params)
    hb = heartbeat.current
    if hb is not None:
        hb.current_job = job_id
    try:
        outcome = body(JobContext(job_id, params, at.device, s.database))
    except JobInputError as exc:
        jobs.fail(s.database, job_id, str(exc), worker=at.worker)
        return "failed"
    except Exception as exc:
        log.exception("job %s failed", job_id)
        jobs.fail(s.database, job_id, f"{type(exc).__name__}: {exc}", worker=at.worker)
        return "failed"
    finally:
        if hb is not None:
            hb.current_job = None
    jobs.succeed(s.database, job_id, at.worker, outcome.samples, outcome.seconds, outcome.result)
    return "succeeded"


def job_task(kind: str) -> Callable[[Body], Body]:
    """Register `body` as the Celery task `mxq.<kind>`; its message carries only the job id."""
    def register(body: Body) -> Body:
        @app.task(name=f"mxq.{kind}")
        def _task(job_id: int) -> str:
            started = time.monotonic()
            state = run_job(int(job_id), body)
            log.info("job %s %s in %.2fs", job_id, state, time.monotonic() - started)
            return state
        return body
    return register
