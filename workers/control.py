"""The Celery tasks of the control queue, which only the schedule process consumes: the tick
that fires due schedules, the reconciler's pass and the retention policy, each run by Celery
beat, the webhook sender's pass, and the fires the API hands over (run-now)."""

from __future__ import annotations

from dataclasses import asdict

from mxq.db import schedules
from mxq.workers.broker.app import app
from mxq.workers.repair.reconcile import reconcile
from mxq.workers.repair.retention import collect
from mxq.workers.schedules.fires import submit_fire, tick
from mxq.workers.settings import get_settings
from mxq.workers.webhooks.sender import send_due


@app.task(name="mxq.tick")  # type: ignore[untyped-decorator]  # Celery has no types
def tick_task() -> list[int]:
    return tick(get_settings())


@app.task(name="mxq.reconcile")  # type: ignore[untyped-decorator]
def reconcile_task() -> dict[str, list[int]]:
    return asdict(reconcile(get_settings()))


@app.task(name="mxq.retention")  # type: ignore[untyped-decorator]
def retention_task() -> int:
    """The retention policy in the schedule process's home: how many things it removed."""
    return len(collect(get_settings()))


@app.task(name="mxq.hooks")  # type: ignore[untyped-decorator]
def hooks_task() -> int:
    """Claim the due webhook deliveries and send them from threads of their own (the task
    returns at once, so a hung endpoint never holds the tick): how many were claimed."""
    return send_due(get_settings())


@app.task(name="mxq.fire")  # type: ignore[untyped-decorator]
def fire_task(fire_id: int) -> int | None:
    """Submit a fire recorded elsewhere (the API's run-now); a fire already settled is left."""
    settings = get_settings()
    sched = schedules.pending_fire(settings.database, int(fire_id))
    return None if sched is None else submit_fire(settings, sched, int(fire_id))
