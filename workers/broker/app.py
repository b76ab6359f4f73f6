"""The Celery app: JSON-only messages, late acks, one job at a time per worker, no result backend.

Job outcomes live in SQL (`db/`), so there is no result backend for users to clean up.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from celery import Celery

from mxq.workers.broker.queues import CONTROL_QUEUE, PRIORITY_STEPS
from mxq.workers.broker.transport import transport_url
from mxq.workers.settings import BrokerSettings, Settings, get_settings

# Task modules a worker imports at start. Device workers (the launcher sets MXQ_DEVICE) run the
# job tasks, which load MXNet (tasks/runtimes/mx_context checks the device at start); a worker
# for a GPU MXNet cannot run (MXQ_MXNET_UNUSABLE) runs inference on ONNX Runtime and refuses the
# rest, never loading MXNet; every other process (the schedule process, a publishing client) gets
# only the control tasks.
CONTROL_TASK_MODULES = ["mxq.workers.control"]
DEVICE_TASK_MODULES = ["mxq.tasks.runtimes.mx_context", "mxq.tasks.runtimes.probe",
                       "mxq.tasks.inference.infer", "mxq.tasks.training.train_task",
                       "mxq.tasks.model_store.register", "mxq.tasks.training.arch_job",
                       "mxq.tasks.inference.device_memory",
                       *CONTROL_TASK_MODULES]
ONNX_TASK_MODULES = ["mxq.tasks.runtimes.onnx_worker", "mxq.tasks.inference.infer",
                     "mxq.tasks.inference.device_memory", *CONTROL_TASK_MODULES]
# How often a publish is retried before the submitter is told the broker is unreachable.
PUBLISH_RETRIES = 2
RETENTION_SECONDS = 3600  # how often the schedule process applies the retention policy


def task_modules(settings: Settings) -> list[str]:
    if not settings.device:
        return CONTROL_TASK_MODULES
    return ONNX_TASK_MODULES if settings.mxnet_unusable else DEVICE_TASK_MODULES


def celery_config(settings: Settings) -> dict[str, Any]:
    return dict(
        include=task_modules(settings),
        broker_url=transport_url(settings.broker),  # kombu's Redis transport, poison-proof
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,  # what Flower (and `celery events`) show of running jobs
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout,
                                  "priority_steps": list(PRIORITY_STEPS)},
        task_publish_retry_policy={"max_retries": PUBLISH_RETRIES, "interval_start": 0.2,
                                   "interval_step": 0.5, "interval_max": 1.0},
        broker_connection_timeout=3,
        beat_schedule={
            "mxq-tick": {"task": "mxq.tick", "schedule": settings.tick_seconds,
                         "options": {"queue": CONTROL_QUEUE, "expires": settings.tick_seconds}},
            "mxq-reconcile": {"task": "mxq.reconcile", "schedule": settings.reconcile_seconds,
                              "options": {"queue": CONTROL_QUEUE,
                                          "expires": settings.reconcile_seconds}},
            "mxq-hooks": {"task": "mxq.hooks", "schedule": settings.hook_seconds,
                          "options": {"queue": CONTROL_QUEUE, "expires": settings.hook_seconds}},
            "mxq-openlineage": {"task": "mxq.openlineage", "schedule": settings.hook_seconds,
                                "options": {"queue": CONTROL_QUEUE, "expires": settings.hook_seconds}},
            "mxq-retention": {"task": "mxq.retention", "schedule": RETENTION_SECONDS,
                              "options": {"queue": CONTROL_QUEUE, "expires": RETENTION_SECONDS}},
        },
    )


def make_app(settings: Settings) -> Celery:
    app = Celery("mxq")
    app.conf.update(celery_config(settings))
    return app


def publisher_transport_options(broker: BrokerSettings) -> dict[str, object]:
    """Socket timeouts for the connections a publisher opens (redis-py waits forever by default):
    a paused Redis accepts connections and never answers, and a publish must give up. Only the
    publishing apps get them; a worker's consumer keeps kombu's own waiting."""
    seconds = broker.timeout_seconds
    return {"visibility_timeout": broker.visibility_timeout, "priority_steps": list(PRIORITY_STEPS),
            "socket_timeout": seconds, "socket_connect_timeout": seconds}


def app_for(settings: Settings) -> Celery:
    """A publishing app for the broker of `settings` (tests and tools talk to several stacks in
    one process), whose broker calls time out after its MXQ_BROKER_TIMEOUT_SECONDS: one per
    broker and timeouts, made once."""
    return _publisher(settings.broker_settings)


@lru_cache(maxsize=4)
def _publisher(broker: BrokerSettings) -> Celery:
    # A publisher's config is made of the broker's settings alone (the rest are defaults it never
    # uses: it runs no task and no beat), so nothing here reads the process's settings.
    settings = Settings.model_construct(broker_url=broker.url, broker_timeout_seconds=broker.timeout_seconds,
                                        visibility_timeout=broker.visibility_timeout)
    app = make_app(settings)
    app.conf.broker_transport_options = publisher_transport_options(broker)
    return app


# The process-wide app; its settings are read when first used, so importing it never fails.
app = Celery("mxq")
app.add_defaults(lambda: celery_config(get_settings()))
