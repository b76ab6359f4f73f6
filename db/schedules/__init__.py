"""Schedules and their fires in SQL. A fire is taken by moving `next_fire_at` with a
compare-and-set, and recorded under a unique (schedule, fire time): two ticks never fire twice.
An inference schedule's fires claim each input's bytes once (`claims.py`) before they submit.

Imports (of mxq): core, db.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mxq import promotion
from mxq.db.engine import rowcount, session_scope
from mxq.db.records import (
    DueSchedule,
    FirePolicy,
    FireRecord,
    ModelRecord,
    ScheduleDetail,
    ScheduleRecord,
    StoredSchedule,
)
from mxq.db.registry import list_models, ownership, promote
from mxq.db.schema import Fire, Job, Schedule, ScoredInput, as_utc, iso
from mxq.db.sharing.teams import rights_of
from mxq.db.sharing.users import owned_by_removed
from mxq.db.webhooks import outbox
from mxq.errors import Conflict, NotFound
from mxq.promotion import PromotionPolicy
from mxq.status import FINISHED, JobKind


class ScheduleNotFound(NotFound):
    """An unknown schedule name."""


class ScheduleExists(Conflict):
    """A schedule of that name exists already."""


# A cron fire whose schedule's previous fire still has its job queued or running starts no job:
# its fire is recorded with an error that starts with this, and shows as "skipped".
SKIPPED = "skipped: "


def schedule_record(sched: Schedule) -> ScheduleRecord:
    return {"name": sched.name, "cron": sched.cron, "tz": sched.tz, "spec": sched.spec,
            "dataset": sched.dataset,
            "promote": sched.promote, "metric": sched.metric, "min_gain": sched.min_gain,
            "min_metric": sched.min_metric, "enabled": sched.enabled, "next_fire_at": iso(sched.next_fire_at),
            "last_fire_at": iso(sched.last_fire_at), "created_at": iso(sched.created_at),
            "owner": sched.owner, "team": sched.team, "priority": sched.priority,
            "preemptible": sched.preemptible, "kind": JobKind(sched.kind), "rescore": sched.rescore,
            "followed_version": sched.followed_version}


def add(url: str, values: dict[str, Any]) -> ScheduleRecord:
    try:
        with session_scope(url) as session:
            row = Schedule(**values)
            session.add(row)
            session.flush()
            return schedule_record(row)
    except IntegrityError:
        raise ScheduleExists(f"a schedule named {values['name']!r} exists already") from None


def _get(session: Session, name: str) -> Schedule:
    row: Schedule | None = session.scalar(select(Schedule).where(Schedule.name == name))
    if row is None:
        known = ", ".join(session.scalars(select(Schedule.name).order_by(Schedule.name))) or "none"
        raise ScheduleNotFound(f"unknown schedule {name!r}; schedules: {known}")
    return row


def _with_id(row: Schedule) -> StoredSchedule:
    """The record, with the id a fire is made against."""
    return {**schedule_record(row), "id": row.id}


def get(url: str, name: str) -> StoredSchedule:
    with session_scope(url) as session:
        return _with_id(_get(session, name))


def detail(url: str, name: str) -> ScheduleDetail:
    """One schedule with its fires, as `mxq schedule show` and the API show it."""
    with session_scope(url) as session:
        record = schedule_record(_get(session, name))
    return {**record, "fires": fires(url, name)}


def list_schedules(url: str) -> list[ScheduleRecord]:
    with session_scope(url) as session:
        return [schedule_record(r) for r in session.scalars(select(Schedule).order_by(Schedule.name))]


def set_enabled(url: str, name: str, enabled: bool, next_fire_at: datetime | None = None) -> None:
    with session_scope(url) as session:
        row = _get(session, name)
        row.enabled = enabled
        if next_fire_at is not None:
            row.next_fire_at = next_fire_at


def remove(url: str, name: str) -> None:
    """Remove the schedule; its fires stay as the history of the jobs they started (each keeps
    the schedule's name and policy), and a fire still training promotes by that policy."""
    with session_scope(url) as session:
        row = _get(session, name)
        session.execute(update(Fire).where(Fire.schedule_id == row.id).values(schedule_id=None))
        session.delete(row)


def _new_fire(session: Session, schedule_id: int, fire_time: datetime, missed: int,
              manual: bool, rescore_version: int | None = None) -> Fire:
    """A fire of the schedule, with what it needs to describe itself if the schedule goes."""
    sched = session.get(Schedule, schedule_id)
    if sched is None:
        raise ScheduleNotFound(f"no schedule {schedule_id} to fire (removed meanwhile)")
    fire = Fire(schedule_id=schedule_id, fire_time=fire_time, missed=missed, manual=manual,
                schedule_name=sched.name, policy={"promote": sched.promote, "metric": sched.metric,
                                                  "min_gain": sched.min_gain,
                                                  "min_metric": sched.min_metric}, owner=sched.owner,
                rescore_version=rescore_version)
    session.add(fire)
    session.flush()
    return fire


def _listed(rows: Iterable[Schedule]) -> list[DueSchedule]:
    return [{**_with_id(r), "next": as_utc(r.next_fire_at)} for r in rows]


def due(url: str, now: datetime) -> list[DueSchedule]:
    with session_scope(url) as session:
        return _listed(session.scalars(select(Schedule).where(
            Schedule.enabled.is_(True), Schedule.next_fire_at <= now, ~owned_by_removed(Schedule.owner))))


def upcoming(url: str, now: datetime) -> list[DueSchedule]:
    """The enabled schedules not due yet (the tick checks that none waits past its next cron
    time, as one does after the clock went back)."""
    with session_scope(url) as session:
        return _listed(session.scalars(select(Schedule).where(Schedule.enabled.is_(True),
                                                              Schedule.next_fire_at > now)))


def move_next(url: str, schedule_id: int, expected_next: datetime, new_next: datetime) -> bool:
    """Move next_fire_at from `expected_next` to `new_next`, firing nothing; False if another
    tick moved it first."""
    with session_scope(url) as session:
        return bool(rowcount(session.execute(
            update(Schedule).where(Schedule.id == schedule_id,
                                   Schedule.next_fire_at == expected_next)
            .values(next_fire_at=new_next))))


def take(url: str, schedule_id: int, expected_next: datetime, new_next: datetime,
         fire_time: datetime, missed: int) -> int | None:
    """Move next_fire_at from `expected_next` and record the fire; None if another tick did, or
    if that fire time has fired already (the clock went back past it): then next_fire_at moves
    on all the same, so the schedule is not stuck on a time it will never fire again."""
    try:
        with session_scope(url) as session:
            moved = rowcount(session.execute(update(Schedule)
                              .where(Schedule.id == schedule_id, Schedule.next_fire_at == expected_next)
                              .values(next_fire_at=new_next, last_fire_at=fire_time)))
            if not moved:
                return None
            return _new_fire(session, schedule_id, fire_time, missed, manual=False).id
    except IntegrityError:
        move_next(url, schedule_id, expected_next, new_next)
        return None


def busy_fire(url: str, schedule_id: int) -> tuple[int, int, str] | None:
    """The newest fire of the schedule whose job has not finished (queued or running): (fire
    id, job id, status), else None. A fire still being submitted (no job, no error yet) is
    not counted: it makes its job or records its error within a tick."""
    with session_scope(url) as session:
        row = session.execute(
            select(Fire.id, Job.id, Job.status).join(Job, Job.id == Fire.job_id)
            .where(Fire.schedule_id == schedule_id, Job.status.not_in(FINISHED))
            .order_by(Fire.id.desc()).limit(1)).first()
        return None if row is None else (int(row[0]), int(row[1]), str(row[2]))


def record_manual(url: str, schedule_id: int, fire_time: datetime) -> int:
    with session_scope(url) as session:
        session.execute(update(Schedule).where(Schedule.id == schedule_id).values(last_fire_at=fire_time))
        return _new_fire(session, schedule_id, fire_time, 0, manual=True).id


def pending_fire(url: str, fire_id: int) -> StoredSchedule | None:
    """The schedule of a fire that has neither a job nor an error yet (else None): what the
    schedule process still has to submit."""
    with session_scope(url) as session:
        fire = session.get(Fire, fire_id)
        if fire is None or fire.job_id is not None or fire.error is not None or \
                fire.scored is not None or fire.schedule_id is None:
            return None
        row = session.get(Schedule, fire.schedule_id)
        return None if row is None else _with_id(row)


def settle_fire(url: str, fire_id: int, **values: Any) -> None:
    """Set the fire's dataset file, job id, error or promotion decision; an error (not a skip)
    is a `schedule.fire_failed` webhook event, in the same transaction."""
    with session_scope(url) as session:
        session.execute(update(Fire).where(Fire.id == fire_id).values(**values))
        error = values.get("error")
        if error and not str(error).startswith(SKIPPED):
            fire = session.get_one(Fire, fire_id)
            outbox.emit(session, "schedule.fire_failed", {"fire": {
                "id": fire.id, "schedule": fire.schedule_name, "fire_time": iso(fire.fire_time),
                "manual": fire.manual, "job_id": fire.job_id, "error": fire.error,
                "owner": fire.owner}})


def fires(url: str, name: str) -> list[FireRecord]:
    with session_scope(url) as session:
        row = _get(session, name)
        q = (select(Fire, Job.status).outerjoin(Job, Job.id == Fire.job_id)
             .where(Fire.schedule_id == row.id).order_by(Fire.fire_time, Fire.id))
        made = _jobs_by_fire(session, row.id)
        return [{"fire_time": iso(f.fire_time), "fired_at": iso(f.fired_at), "manual": f.manual,
                 "missed": f.missed, "catch_up": f.missed > 0, "dataset_file": f.dataset_file,
                 "job_id": f.job_id, "job_status": status or _fire_status(f.error),
                 "error": f.error, "promotion": f.promotion, "owner": f.owner, "scored": f.scored,
                 "jobs": made.get(f.id, []), "rescore_version": f.rescore_version}
                for f, status in session.execute(q)]


def _jobs_by_fire(session: Session, schedule_id: int) -> dict[int, list[int]]:
    """An inference schedule's fires' jobs (one per file each scored), by fire."""
    made: dict[int, list[int]] = {}
    for fire_id, job_id in session.execute(
            select(ScoredInput.fire_id, ScoredInput.job_id).join(Fire, Fire.id == ScoredInput.fire_id)
            .where(Fire.schedule_id == schedule_id).order_by(ScoredInput.id)):
        if fire_id is not None and job_id is not None:
            made.setdefault(fire_id, []).append(job_id)
    return made


class Scoring(enum.Enum):
    """What a fire of an inference schedule is, once it knows the version it scores with."""

    REGULAR = "regular"  # the version it followed (or its first fire): new files only
    RESCORE = "rescore"  # a promotion since its last fire: this fire re-scores, at `--rescore`
    TAKEN = "taken"  # another fire is that promotion's re-score: this one leaves it the files


def follow(url: str, schedule_id: int, fire_id: int, version: int) -> Scoring:
    """Record the version fire `fire_id` scores with (what a promotion is then compared with:
    `rescoring`), and decide in the same transaction whether the fire is a promotion's re-score.

    The one place the re-score and the regular fire are decided: a promotion made since the
    schedule's last fire (it follows the promoted version, re-scores at a `--rescore` level, and
    fired before) makes the first fire to see it the re-score, whether the tick's re-score pass
    or a regular fire due at that moment gets here first; a compare-and-set on the followed
    version lets exactly one of them. A schedule that never fired has nothing to re-score: its
    first fire scores every file, at its own priority."""
    with session_scope(url) as session:
        sched = session.get(Schedule, schedule_id)
        if sched is None:
            raise ScheduleNotFound(f"no schedule {schedule_id}")
        followed, fire = sched.followed_version, session.get(Fire, fire_id)
        if fire is not None and fire.rescore_version is not None:
            return Scoring.RESCORE  # made by `take_rescore`, which moved the followed version
        promoted = (followed is not None and followed != version and sched.rescore is not None
                    and sched.spec.get("model_version") is None)
        moved = rowcount(session.execute(
            update(Schedule).where(Schedule.id == schedule_id, Schedule.followed_version.is_(None)
                                   if followed is None else Schedule.followed_version == followed)
            .values(followed_version=version)))
        if not promoted:
            return Scoring.REGULAR
        if not moved or fire is None:
            return Scoring.TAKEN
        fire.rescore_version = version
        return Scoring.RESCORE


def rescoring(url: str) -> list[StoredSchedule]:
    """The enabled inference schedules that re-score on promotion: those following a model's
    promoted version (none pinned) with a `rescore` level, which fired once at least."""
    with session_scope(url) as session:
        rows = session.scalars(select(Schedule).where(
            Schedule.kind == "infer", Schedule.enabled.is_(True), Schedule.rescore.is_not(None),
            Schedule.followed_version.is_not(None), ~owned_by_removed(Schedule.owner)))
        return [_with_id(r) for r in rows if r.spec.get("model_version") is None]


def take_rescore(url: str, schedule_id: int, followed: int, promoted: int, now: datetime) -> int | None:
    """Record the fire a promotion makes (once: the schedule's followed version moves from
    `followed` to `promoted` by a compare-and-set in the same transaction); its id, or None when
    another tick took it."""
    with session_scope(url) as session:
        moved = rowcount(session.execute(
            update(Schedule).where(Schedule.id == schedule_id, Schedule.followed_version == followed)
            .values(followed_version=promoted, last_fire_at=now)))
        if not moved:
            return None
        return _new_fire(session, schedule_id, now, 0, manual=False, rescore_version=promoted).id


def _fire_status(error: str | None) -> str | None:
    """A fire without a job: skipped (its previous fire still ran), failed, or not submitted yet."""
    if error is None:
        return None
    return "skipped" if error.startswith(SKIPPED) else "failed"


def fire_of(url: str, fire_id: int) -> FirePolicy:
    """The schedule and policy a fire was fired with, from the fire itself: it outlives its
    schedule (`removed` then says so)."""
    with session_scope(url) as session:
        fire = session.get(Fire, fire_id)
        if fire is None or fire.policy is None:
            raise ScheduleNotFound(f"no fire {fire_id} of a schedule")
        return {"schedule": str(fire.schedule_name), "fire_time": iso(fire.fire_time),
                "promote": fire.policy["promote"], "metric": fire.policy["metric"],
                "min_gain": float(fire.policy["min_gain"]),
                "min_metric": fire.policy.get("min_metric"),  # none before migration 0026
                "removed": fire.schedule_id is None}


def _may_not_promote(url: str, fire_id: int, name: str) -> str | None:
    """Why the fire's owner may not promote model `name` now (its rights are checked when the
    schedule is added and again here: a role or a team may have changed since); None if it may."""
    with session_scope(url) as session:
        fire = session.get(Fire, fire_id)
        owner = fire.owner if fire is not None else None
    owned = ownership(url, name)
    if owner is None or owned is None or rights_of(url, owner).may_manage_model(*owned):
        return None
    return (f"the schedule's owner {owner!r} may not promote model {name!r} (its owner "
            f"{owned[0] or 'the admins'}{f', team {owned[1]}' if owned[1] else ''} and admins may)")


def _rejudged(metric: str, current: ModelRecord | None,
              rejudged: tuple[int, dict[str, float]] | None) -> float | None:
    """The promoted version's figure measured again on the new version's validation split, if
    the training measured it (None: the figure stored at its registration stands)."""
    if current is None or rejudged is None or rejudged[0] != current["version"]:
        return None
    return rejudged[1].get(metric)


def decide_promotion(url: str, fire_id: int, name: str, version: int, metrics: dict[str, Any],
                     rejudged: tuple[int, dict[str, float]] | None = None) -> dict[str, Any]:
    """Compare the new version with the promoted one by the schedule's policy; promote or keep.

    `rejudged` is (version, metrics) of the promoted version measured again by the training on
    its own validation split: both are then compared on the same held-out samples, not on figures
    of different nights' data. The figure stored at its registration stands otherwise."""
    stored = fire_of(url, fire_id)
    policy = PromotionPolicy(stored["promote"], stored["metric"], stored["min_gain"],
                             stored["min_metric"])
    new = metrics.get(policy.metric)
    current = next((m for m in list_models(url, name) if m["promoted"]), None)
    again = _rejudged(policy.metric, current, rejudged)
    old = again if again is not None else current["metrics"].get(policy.metric) if current else None
    decision = promotion.decide(policy, new, old, has_current=current is not None)
    if decision.promoted and (refused := _may_not_promote(url, fire_id, name)) is not None:
        decision = promotion.Decision(False, refused)
    if decision.promoted:
        promote(url, name, version)
    record = promotion.decision_record(decision, policy, version, new,
                                       current["version"] if current else None, old)
    if current is not None:
        record["promoted_value_from"] = "this validation split" if again is not None else "its registration"
    settle_fire(url, fire_id, promotion=record)
    return record
