"""Celery app and settings, devices, queues, routing, the launcher. `celery -A workers` finds `app`."""

from workers.app import app
from workers import heartbeat as _heartbeat  # noqa: F401  (connects the worker signals)

__all__ = ["app"]
