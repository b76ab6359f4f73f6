"""Publish a job's message: when it is submitted, and again when its worker died (requeue).

The launcher, the reconciler and the job frame need only this, not the submit path (validation,
routing, model resolution). A message carries only the job's id; the row says the rest.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import redis
from kombu.utils.url import maybe_sanitize_url

from mxq import priorities
from mxq.db import events, jobs
from mxq.db.records import JobRoute
from mxq.errors import Unavailable
from mxq.workers.broker.app import app_for
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


class SubmitError(Unavailable):
    """The database or the broker cannot be reached: the job was not submitted."""


class BrokerTimeout(SubmitError):
    """The broker did not answer within MXQ_BROKER_TIMEOUT_SECONDS (paused, frozen, overloaded)."""


def task_name(kind: str) -> str:
    return f"mxq.{kind}"


def within(seconds: float, what: str, broker: str, call: Callable[[], T]) -> T:
    """`call()`, or BrokerTimeout once `seconds` have passed without its answer.

    Socket timeouts alone do not bound a call: kombu's publish retries and redis-py's own
    retries multiply them. The call runs in a daemon thread that is left to its socket timeout
    when it is late (its message, should it still go out, is one the reconciler then finds and
    a second delivery is dropped at claim), so a process exits without waiting for it."""
    box: dict[str, T] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"mxq-broker-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    late = BrokerTimeout(f"the broker at {maybe_sanitize_url(broker)} did not answer {what} "
                         f"within {seconds:g}s (MXQ_BROKER_TIMEOUT_SECONDS)")
    if thread.is_alive():
        raise late
    if failure and _timed_out(failure[0]):  # its socket timeout beat this deadline: the same news
        raise late from failure[0]
    if failure:
        raise failure[0]
    return box["value"]


def _timed_out(exc: BaseException) -> bool:
    """A read or connect that timed out, as redis-py raises it or kombu wraps it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (TimeoutError, redis.TimeoutError)):
            return True
        seen = seen.__cause__
    return False


# Workers and the reconciler wait out a broker restart, about two minutes, by Celery's own publish
# retry (kombu's `ensure`, which retries only the transport's connection errors: a bug such as an
# encoding error is raised at once); a user's submit keeps the app's short policy and is told
# within its deadline (MXQ_BROKER_TIMEOUT_SECONDS).
PATIENT_RETRY_POLICY = {"max_retries": 27, "interval_start": 0.2, "interval_step": 1.0,
                        "interval_max": 5.0}


@dataclass(frozen=True)
class Turn:
    """Where a job's message stands among the others of its queue: its priority level, and
    whether an attempt of it ran before (preempted, or its worker died): such a job goes ahead of
    the jobs of its level that never started, since it started before them."""

    level: priorities.Level = priorities.DEFAULT
    started: bool = False

    @property
    def broker_priority(self) -> int:
        """The kombu priority of the message: one of PRIORITY_STEPS, the lowest taken first."""
        return 2 * priorities.LEVELS.index(self.level) + (0 if self.started else 1)


def _send(settings: Settings, job_id: int, kind: str, queue: str, turn: Turn,
          retry_policy: dict[str, float] | None = None) -> None:
    app_for(settings).send_task(task_name(kind), args=[job_id], queue=queue, task_id=f"job-{job_id}",
                              retry=True, retry_policy=retry_policy, priority=turn.broker_priority)


def publish(settings: Settings, job_id: int, kind: str, queue: str, patient: bool = False,
            turn: Turn = Turn()) -> None:
    """Send the job's message to `queue` at its `turn` (again, when requeuing a job whose worker
    died or that was preempted).

    `patient` (inside workers, the reconciler) retries for minutes through a broker restart;
    otherwise (a user's submit) the broker has MXQ_BROKER_TIMEOUT_SECONDS to take it, and
    SubmitError (BrokerTimeout when it did not answer) says it did not: the job's row stays
    queued for the reconciler to publish."""
    try:
        if patient:
            _send(settings, job_id, kind, queue, turn, PATIENT_RETRY_POLICY)
        else:
            within(settings.broker_timeout_seconds, f"the publish of job {job_id}", settings.broker,
                   lambda: _send(settings, job_id, kind, queue, turn))
    except BrokerTimeout:
        raise
    except Exception as exc:
        raise SubmitError(f"could not publish job {job_id} to {maybe_sanitize_url(settings.broker)}: "
                          f"{exc}") from exc


def republish(settings: Settings, job_id: int, route: JobRoute) -> None:
    """Publish a job again as SQL routes it (its queue, and its turn there), patiently."""
    publish(settings, job_id, route["kind"], route["queue"], patient=True,
            turn=Turn(priorities.Level(route["priority"]), route["started"]))


def requeue(settings: Settings, job_id: int, kind: str, queue: str, why: str,
            stale_before: datetime | None = None) -> bool | None:
    """Publish a dead job again (True), or fail it when its attempts are used up (False).

    With `stale_before`, a job whose heartbeat came back meanwhile is left alone (None)."""
    job = jobs.job_row(settings.database, job_id)
    if job is None:
        return None
    # As the limit counts (`jobs.charged`): a yield or a device fault uses no attempt.
    attempts = job["attempts"] - job["preemptions"] - job["device_faults"]
    worker = job["worker"]
    if not jobs.clear_heartbeat(settings.database, job_id, stale_before):
        return None
    if attempts >= settings.max_attempts:
        jobs.fail(settings.database, job_id,
                  jobs.exhausted_message(attempts, settings.max_attempts, worker))
        log.error("job %s failed: %s on all %s attempts", job_id, why, attempts)
        return False
    turn = Turn(priorities.Level(job["priority"]), started=True)
    publish(settings, job_id, kind, queue, patient=True, turn=turn)
    events.record(settings.database, job_id, events.REQUEUED, f"requeued to {queue}: {why}",
                  attempts=attempts, worker=worker)
    return True
