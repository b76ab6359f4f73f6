"""The broker's side of a submit: checked before anything is written, then each job's message
(carrying only its id) published within MXQ_BROKER_TIMEOUT_SECONDS per batch."""

from __future__ import annotations

from kombu import Connection
from kombu.utils.url import maybe_sanitize_url

from mxq.db.engine import ping, safe_url
from mxq.status import JobKind
from mxq.workers.broker.app import app_for
from mxq.workers.broker.publish import BrokerTimeout, SubmitError, Turn, publish, task_name, within
from mxq.workers.settings import Settings

PUBLISH_BATCH = 1000  # kombu's publish batch: a submit's deadline is per batch


def check_database(settings: Settings) -> None:
    """SubmitError when the database does not answer (nothing is written then)."""
    if (reason := ping(settings.database)) is not None:
        raise SubmitError(f"database unreachable at {safe_url(settings.database)}: {reason}")


def _connect(settings: Settings) -> None:
    seconds = settings.broker_timeout_seconds
    with Connection(settings.broker,  # type: ignore[no-untyped-call]  # kombu has no types
                    connect_timeout=seconds, transport_options={
                        "socket_timeout": seconds, "socket_connect_timeout": seconds}) as conn:
        conn.ensure_connection(max_retries=1, timeout=seconds)


def check_broker(settings: Settings) -> None:
    """SubmitError when the broker refuses (nothing is written then); BrokerTimeout when it
    does not answer within MXQ_BROKER_TIMEOUT_SECONDS."""
    try:
        within(settings.broker_timeout_seconds, "a connection check", settings.broker,
               lambda: _connect(settings))
    except BrokerTimeout:
        raise
    except Exception as exc:  # kombu raises several unrelated types here
        raise SubmitError(f"broker unreachable at {maybe_sanitize_url(settings.broker)}: {exc}") from exc


def broker_late(settings: Settings) -> BrokerTimeout | None:
    """The broker checked before anything is written: SubmitError when it refuses; its
    BrokerTimeout when it does not answer in time (the jobs are then stored, not published)."""
    try:
        check_broker(settings)
    except BrokerTimeout as exc:
        return exc
    return None


def publish_all(settings: Settings, kind: JobKind, queue: str, ids: list[int], turn: Turn) -> None:
    """Each job's message, within MXQ_BROKER_TIMEOUT_SECONDS per publish batch; SubmitError
    when the broker refuses or does not answer (the jobs stay queued for the reconciler)."""
    if len(ids) == 1:
        publish(settings, ids[0], kind, queue, turn=turn)
        return
    try:
        within(settings.broker_timeout_seconds * -(-len(ids) // PUBLISH_BATCH),
               f"the publish of {len(ids)} jobs", settings.broker,
               lambda: _send_many(settings, kind, queue, ids, turn))
    except SubmitError:
        raise
    except Exception as exc:  # kombu raises several unrelated types here
        raise SubmitError(f"could not publish to {maybe_sanitize_url(settings.broker)}: {exc}") from exc


def _send_many(settings: Settings, kind: JobKind, queue: str, ids: list[int], turn: Turn) -> None:
    """One pipelined round trip per 1,000 messages (kombu's publish batch) instead of one each."""
    app = app_for(settings)
    with app.producer_or_acquire() as producer, producer.batch():
        for job_id in ids:
            app.send_task(task_name(kind), args=[job_id], queue=queue, task_id=f"job-{job_id}",
                          producer=producer, priority=turn.broker_priority)
