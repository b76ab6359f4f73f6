"""The Celery tasks of the control queue, which only the schedule process consumes: the tick
that fires due schedules and the reconciler's pass, each run by Celery beat."""

from __future__ import annotations

from dataclasses import asdict

from mxq.workers.app import app
from mxq.workers.fires import tick
from mxq.workers.reconcile import reconcile
from mxq.workers.settings import get_settings


@app.task(name="mxq.tick")  # type: ignore[untyped-decorator]  # Celery has no types
def tick_task() -> list[int]:
    return tick(get_settings())


@app.task(name="mxq.reconcile")  # type: ignore[untyped-decorator]
def reconcile_task() -> dict[str, list[int]]:
    return asdict(reconcile(get_settings()))
