"""Schedule fires: find due schedules, fire each once, submit its training job.

`tick(settings, now)` takes the clock as an argument, so tests drive it with any time; the
schedule process runs it every MXQ_TICK_SECONDS as the Celery task `mxq.tick` (workers/control.py).
After downtime (or a clock jump forward), every missed fire time collapses into one catch-up fire
at the latest of them, which counts them (`missed`); after the clock went back, the next fire
comes back to the next cron time (`realign`) and a fire time never fires twice.

A cron fire never starts a training while the schedule's previous fire's job is still queued or
running (an every-minute schedule whose training takes ten would build an endless backlog): the
fire is recorded as skipped, naming that job, and the schedule fires again at its next time. A
manual run (`mxq schedule run`, the API's run-now) is asked for by a person and always submits.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from mxq.db import schedules
from mxq.db.records import ScheduleRecord, StoredSchedule
from mxq.db.registry import check_registrant, resolve
from mxq.db.schema import utcnow
from mxq.db.sharing.teams import check_team
from mxq.errors import JobRejected, MxqError
from mxq.names import check_name
from mxq.priorities import Priority
from mxq.status import JobKind
from mxq.users import local_owner
from mxq.workers.broker.app import app_for
from mxq.workers.broker.queues import CONTROL_QUEUE
from mxq.workers.jobs.kinds.params import ParamsError, validated
from mxq.workers.jobs.kinds.train import TrainParams, check_calibration, pinned_code
from mxq.workers.jobs.submit import submit
from mxq.workers.schedules import scoring
from mxq.workers.schedules.cron import check, due, next_after
from mxq.workers.schedules.sources import check_source, newest_file
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)
POLICIES = ("always", "if-better", "never")


def submit_fire(settings: Settings, sched: StoredSchedule, fire_id: int) -> int | None:
    """Resolve the dataset and queue the training job, or score an inference schedule's new
    files; a failure is recorded on the fire.

    Returns the training job's id (None when it could not be made, and for inference fires,
    whose jobs are the fire's `jobs`)."""
    if sched["kind"] == "infer":
        try:
            scoring.fire(settings, sched, fire_id)
        except (MxqError, ValueError) as exc:
            schedules.settle_fire(settings.database, fire_id, error=str(exc))
            log.info("schedule %s fire %s failed: %s", sched["name"], fire_id, exc)
        return None
    try:
        dataset = newest_file(settings, sched["dataset"])
        schedules.settle_fire(settings.database, fire_id, dataset_file=str(dataset))
        params = {**sched["spec"], "dataset": str(dataset), "fire_id": fire_id}
        route = params["device_list"][0] if params.get("device_list") else "auto"
        job_id = submit(settings, JobKind.TRAIN, params, route, allow_offline=True, owner=sched["owner"],
                        priority=Priority.of(sched["priority"], sched["preemptible"]),
                        team=sched["team"])
        schedules.settle_fire(settings.database, fire_id, job_id=job_id)
        return job_id
    except JobRejected as exc:
        schedules.settle_fire(settings.database, fire_id, job_id=exc.job_id, error=str(exc))
        return exc.job_id
    except (MxqError, ValueError) as exc:
        schedules.settle_fire(settings.database, fire_id, error=str(exc))
        log.info("schedule %s fire %s failed: %s", sched["name"], fire_id, exc)
        return None


def realign(settings: Settings, now: datetime) -> list[str]:
    """Bring back every schedule whose next fire lies past its next cron time after `now`, and
    return their names.

    Only a clock that went back makes one: a tick under a clock a day ahead fired the day's
    catch-up and set the next fire a day ahead; left there, the schedule would not fire for a
    day once the clock is right again. It fires at its cron times from now on, and a time that
    already fired does not fire again (`schedules.take`)."""
    moved = []
    for sched in schedules.upcoming(settings.database, now):
        natural = next_after(sched["cron"], sched["tz"], now)
        if sched["next"] > natural and schedules.move_next(settings.database, sched["id"],
                                                           sched["next"], natural):
            log.warning("schedule %s: its next fire %s lies past its next cron time %s (the "
                        "clock went back); it fires at %s", sched["name"], sched["next"].isoformat(),
                        natural.isoformat(), natural.isoformat())
            moved.append(sched["name"])
    return moved


def tick(settings: Settings, now: datetime | None = None) -> list[int]:
    """Fire every due schedule once; return the ids of the fires this call made."""
    now = now or utcnow()
    realign(settings, now)
    made = []
    for sched in schedules.due(settings.database, now):
        latest, missed = due(sched["cron"], sched["tz"], sched["next"], now)
        following = next_after(sched["cron"], sched["tz"], max(latest, now))
        fire_id = schedules.take(settings.database, sched["id"], sched["next"], following, latest,
                                 missed)
        if fire_id is None:
            continue  # another tick took it
        if sched["kind"] == "infer" or not _skipped_for_busy(settings, sched, fire_id):
            submit_fire(settings, sched, fire_id)
        made.append(fire_id)
    return made + rescore(settings, now)


def rescore(settings: Settings, now: datetime) -> list[int]:
    """Fire, once, every inference schedule whose model had another version promoted since its
    last fire: the new version scores the schedule's standing inputs at the schedule's `rescore`
    level. Read from the registry's state at each tick, not from a message, so a promotion made
    while the schedule process was down is seen when it is back."""
    made = []
    for sched in schedules.rescoring(settings.database):
        try:
            current = resolve(settings.database, sched["spec"]["model"])["version"]
        except MxqError:
            continue  # the model went; its fires say so at their times
        followed = sched["followed_version"]
        if followed is None or current == followed:
            continue
        fire_id = schedules.take_rescore(settings.database, sched["id"], followed, current, now)
        if fire_id is not None:
            log.info("schedule %s: %s version %s is promoted: its inputs are scored again",
                     sched["name"], sched["spec"]["model"], current)
            submit_fire(settings, sched, fire_id)
            made.append(fire_id)
    return made


def _skipped_for_busy(settings: Settings, sched: StoredSchedule, fire_id: int) -> bool:
    """Record the fire as skipped when an earlier fire's job of the schedule has not finished;
    True when it was."""
    busy = schedules.busy_fire(settings.database, sched["id"])
    if busy is None or busy[0] == fire_id:
        return False
    earlier, job_id, status = busy
    reason = (f"{schedules.SKIPPED}the previous fire's job {job_id} (fire {earlier}) is still "
              f"{status}; a schedule starts no training while its last one runs")
    schedules.settle_fire(settings.database, fire_id, error=reason)
    log.info("schedule %s fire %s %s", sched["name"], fire_id, reason)
    return True


def run_now(settings: Settings, name: str, now: datetime | None = None) -> int:
    """Fire the schedule once, at once, outside its cron times."""
    sched = schedules.get(settings.database, name)
    fire_id = schedules.record_manual(settings.database, sched["id"], now or utcnow())
    submit_fire(settings, sched, fire_id)
    return fire_id


def request_fire(settings: Settings, name: str, now: datetime | None = None) -> int:
    """Record a fire now and hand it to the schedule process (the `mxq.fire` task on the control
    queue), which resolves the dataset and submits the job: the API's run-now never walks a
    dataset glob in its request handler. Should the message be lost, the reconciler submits the
    fire after FIRE_GRACE_SECONDS."""
    sched = schedules.get(settings.database, name)
    fire_id = schedules.record_manual(settings.database, sched["id"], now or utcnow())
    try:
        app_for(settings).send_task("mxq.fire", args=[fire_id], queue=CONTROL_QUEUE,
                                           task_id=f"fire-{fire_id}")
    except Exception as exc:  # kombu raises several unrelated types; the reconciler catches up
        log.warning("fire %s of %s not handed over (%s); the reconciler will submit it", fire_id,
                    name, exc)
    return fire_id


def add_schedule(settings: Settings, name: str, cron: str, tz: str, dataset: str,
                 spec: dict[str, Any], promote: str, metric: str, min_gain: float,
                 now: datetime | None = None, owner: str | None = None,
                 priority: Priority = Priority(), team: str | None = None,
                 min_metric: float | None = None) -> ScheduleRecord:
    """Check everything a fire will need, then store the schedule with its first fire time,
    owned by `owner` (default `local:<login>`) and shared with `team`; its fires' jobs run at
    `priority`. Its owner must be allowed to register (and so promote) versions of the model it
    trains, now and again at every fire. With `min_metric`, a version whose `metric` is below it
    (or missing) is registered and never promoted."""
    owner = owner or local_owner()
    check_name(name, "schedule name")  # shown, listed and put in URLs: no control characters
    team = check_team(settings.database, team, owner)
    check(cron, tz)
    if promote not in POLICIES:
        raise ParamsError(f"--promote {promote!r}: expected one of {', '.join(POLICIES)}")
    for option, value in (("--min-gain", min_gain), ("--min-metric", min_metric)):
        if value is not None and not math.isfinite(value):
            raise ParamsError(f"{option} {value}: give a finite number")
    # the training options, checked now, not at 3 am
    typed = validated(TrainParams, {**spec, "dataset": dataset})
    check_registrant(settings.database, typed.name, owner)
    check_source(settings, dataset)
    check_calibration(settings, typed.calibration)
    pinned_code(settings.database, typed.arch)  # a registered one known now (a fire pins its newest)
    return schedules.add(settings.database, {
        "name": name, "cron": cron, "tz": tz, "spec": spec, "dataset": dataset, "promote": promote,
        "metric": metric, "min_gain": min_gain, "min_metric": min_metric, "enabled": True,
        "next_fire_at": next_after(cron, tz, now or utcnow()), "owner": owner, "team": team,
        "priority": priority.level, "preemptible": priority.preemptible})


def resume(settings: Settings, name: str, now: datetime | None = None) -> None:
    """Enable again; fires missed while paused are skipped, not caught up."""
    sched = schedules.get(settings.database, name)
    schedules.set_enabled(settings.database, name, True,
                          next_after(sched["cron"], sched["tz"], now or utcnow()))
