"""The Celery tasks of the control queue, which only the schedule process consumes: the tick
that fires due schedules, the reconciler's pass and the retention policy, each run by Celery
beat, the webhook sender's pass, the OpenLineage export's pass, and the fires the API hands over
(run-now).

The process's one worker runs them one at a time, so a fire, which may hash a large folder or
list a slow bucket, runs in a thread of its own (`_in_background`): the reconciler and the
webhook sender never wait behind it. A fire cut off by the process's end is finished by the next
one or by the reconciler (its files' claims and idempotency keys make each job once)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict

from mxq.db import schedules
from mxq.workers.broker.app import app
from mxq.workers.openlineage import sender as openlineage
from mxq.workers.repair.reconcile import reconcile
from mxq.workers.retention import collect
from mxq.workers.schedules.fires import submit_fire, tick
from mxq.workers.settings import get_settings
from mxq.workers.webhooks.sender import send_due

log = logging.getLogger(__name__)
_ticking = threading.Lock()  # one tick at a time: the next waits for its turn in the next beat
_exporting = threading.Lock()  # one OpenLineage pass at a time


def _in_background(name: str, work: Callable[[], object], done: threading.Lock | None = None) -> None:
    """Run `work` in a daemon thread, its error logged (`done`, held by the caller, released after)."""
    def run() -> None:
        try:
            work()
        except Exception:
            log.exception("%s failed", name)
        finally:
            if done is not None:
                done.release()

    threading.Thread(target=run, daemon=True, name=name).start()


@app.task(name="mxq.tick")  # type: ignore[untyped-decorator]  # Celery has no types
def tick_task() -> bool:
    """Fire the due schedules in the background; False when the last tick still runs."""
    if not _ticking.acquire(blocking=False):
        return False
    settings = get_settings()
    _in_background("mxq-tick", lambda: tick(settings), _ticking)
    return True


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


@app.task(name="mxq.openlineage")  # type: ignore[untyped-decorator]
def openlineage_task() -> bool:
    """Send the due OpenLineage events in the background (a slow receiver holds only that
    thread); False when OpenLineage is not configured or the last pass still runs."""
    if not openlineage.configured() or not _exporting.acquire(blocking=False):
        return False
    settings = get_settings()
    _in_background("mxq-openlineage", lambda: openlineage.send_due(settings), _exporting)
    return True


@app.task(name="mxq.fire")  # type: ignore[untyped-decorator]
def fire_task(fire_id: int) -> bool:
    """Submit a fire recorded elsewhere (the API's run-now), in the background; a fire already
    settled is left (False)."""
    settings = get_settings()
    sched = schedules.pending_fire(settings.database, int(fire_id))
    if sched is None:
        return False
    _in_background(f"mxq-fire-{fire_id}", lambda: submit_fire(settings, sched, int(fire_id)))
    return True
