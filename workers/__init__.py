"""Celery app and settings, devices, queues, routing, the launcher. `celery -A workers` finds `app`."""

from workers import heartbeat as _heartbeat  # noqa: F401  (connects the worker signals)
from workers.app import app

__all__ = ["app"]
