"""The webhook outbox: an event becomes one `hook_deliveries` row per enabled endpoint that
wants it, inserted in the caller's session, so it commits with the change it reports or not at
all (never lost, never sent for a change that rolled back). Nothing here sends: the schedule
process claims due rows (`claim_due`), POSTs them and settles each (`settle`), so a slow or dead
endpoint never slows a worker or an API request, which only insert.

Emitting costs one small query (the enabled endpoints and their events) when no endpoint wants
the event. A delivery is tried until `expires_at` (a day after the event, or after a redelivery
by hand), its waits doubling from BACKOFF_FIRST up to BACKOFF_MOST; then it is `gave_up`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select, update
from sqlalchemy.orm import Session

from mxq.db.engine import rowcount, session_scope
from mxq.db.records import DELIVERY_STATUSES, HOOK_EVENTS, DeliveryRecord
from mxq.db.schema import Hook, HookDelivery, Job, as_utc, iso, utcnow
from mxq.db.sharing.users import owned_by_removed
from mxq.errors import NotFound, UserError
from mxq.status import DeliveryStatus, JobStatus

PENDING, DELIVERED, FAILED, GAVE_UP = DELIVERY_STATUSES
SENDABLE = (PENDING, FAILED)
WINDOW = timedelta(days=1)  # how long a delivery is retried
BACKOFF_FIRST = 30.0  # seconds after the first failed attempt
BACKOFF_MOST = 3600.0  # the longest wait between two attempts
# A claimed attempt's lease: past it, a sender that died mid-send leaves the delivery due again.
# Far longer than a send may take (MXQ_HOOK_TIMEOUT_SECONDS bounds each phase of it).
LEASE = timedelta(minutes=5)
MAX_ERROR_CHARS = 300


class DeliveryNotFound(NotFound):
    """No delivery has that id."""


def new_id() -> str:
    """A delivery id: `dlv_` and 32 random hex digits, unguessable and never reused."""
    return f"dlv_{uuid.uuid4().hex}"


def backoff(attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt: 30 s, 60 s, 120 s, … at most an hour."""
    return timedelta(seconds=min(BACKOFF_FIRST * 2 ** min(max(attempts - 1, 0), 20), BACKOFF_MOST))


def check_events(events: Iterable[str]) -> list[str]:
    """The events an endpoint asks for, each one mxq sends, in mxq's order, without repeats."""
    wanted = {e.strip() for e in events if e.strip()}
    unknown = sorted(wanted - set(HOOK_EVENTS))
    if unknown or not wanted:
        raise UserError(f"unknown webhook event(s) {', '.join(unknown) or '(none given)'}; the "
                        f"events are {', '.join(HOOK_EVENTS)}")
    return [e for e in HOOK_EVENTS if e in wanted]


def _listeners(session: Session) -> list[tuple[int, list[str]]]:
    """The enabled endpoints and the events each wants: the one query an event costs."""
    return [(r.id, list(r.events)) for r in session.execute(select(Hook.id, Hook.events)
                                                               .where(Hook.enabled))]


def _wanting(listeners: list[tuple[int, list[str]]], event: str) -> list[int]:
    return [hook_id for hook_id, events in listeners if event in events]


def emit(session: Session, event: str, data: dict[str, Any],
         listeners: list[tuple[int, list[str]]] | None = None) -> list[str]:
    """The event's deliveries, one per endpoint that wants it, in the caller's transaction; their
    ids (none when no endpoint wants it)."""
    assert event in HOOK_EVENTS, event
    targets = _wanting(_listeners(session) if listeners is None else listeners, event)
    if not targets:
        return []
    now = utcnow()
    rows: list[dict[str, object]] = [{"id": new_id(), "hook_id": hook_id, "event": event, "payload": data,
             "status": PENDING, "attempts": 0, "next_attempt_at": now, "expires_at": now + WINDOW,
             "created_at": now} for hook_id in targets]
    session.execute(insert(HookDelivery), rows)
    return [str(r["id"]) for r in rows]


def job_ended(session: Session, job_ids: Iterable[int]) -> None:
    """`job.finished` or `job.failed` for each of `job_ids` that ended so in this transaction: a
    job users submitted, not a chunk or a node's part (their parent's end is the event)."""
    listeners = _listeners(session)
    if not (_wanting(listeners, "job.finished") or _wanting(listeners, "job.failed")):
        return
    ended = session.scalars(select(Job).where(Job.id.in_(list(job_ids)), Job.parent_id.is_(None),
                                              Job.status.in_([JobStatus.SUCCEEDED, JobStatus.FAILED])))
    for job in ended:
        event = "job.finished" if job.status == JobStatus.SUCCEEDED else "job.failed"
        emit(session, event, {"job": job_data(job)}, listeners)


def job_data(job: Job) -> dict[str, Any]:
    """What a job event says of the job: enough to act on, never its parameters whole."""
    params = job.params or {}
    return {"id": job.id, "kind": job.kind, "status": job.status, "owner": job.owner,
            "team": job.team, "error": job.error, "model": params.get("model") or params.get("name"),
            "model_version": params.get("model_version"), "schedule_fire": params.get("fire_id"),
            "samples": job.samples,
            "seconds": job.seconds, "submitted_at": iso(job.submitted_at),
            "started_at": iso(job.started_at), "finished_at": iso(job.finished_at)}


@dataclass(frozen=True)
class Claimed:
    """One attempt the sender makes: the delivery, the attempt's number, where and how it goes.
    The secret is never in its repr (a log line of it would leak it)."""

    id: str
    attempt: int
    event: str
    payload: dict[str, Any]
    created_at: str | None
    hook_id: int
    url: str
    secret: str = field(repr=False)


def _due(now: datetime, skip_hooks: Iterable[int] = ()) -> tuple[ColumnElement[bool], ...]:
    """Deliveries due at `now` to enabled endpoints (of a user not removed), but `skip_hooks`'."""
    return (HookDelivery.status.in_(SENDABLE), HookDelivery.next_attempt_at <= now, Hook.enabled.is_(True),
            ~owned_by_removed(Hook.owner), HookDelivery.hook_id.not_in(list(skip_hooks)))


def count_due(url: str, now: datetime, most: int) -> int:
    """How many deliveries are due, counted up to `most` (how many senders to start)."""
    with session_scope(url) as session:
        due = select(HookDelivery.id).join(Hook, Hook.id == HookDelivery.hook_id).where(*_due(now))
        return int(session.scalar(select(func.count()).select_from(due.limit(most).subquery())) or 0)


def claim_due(url: str, now: datetime, limit: int, skip_hooks: Iterable[int] = ()) -> list[Claimed]:
    """Up to `limit` due deliveries of enabled endpoints (but `skip_hooks`', which have enough in
    flight), each one attempt more, their next try moved a lease ahead: a guarded UPDATE per
    row (on the attempts it read), so two senders never make the same attempt, and a sender that
    dies mid-send leaves the row due again."""
    if limit <= 0:
        return []
    with session_scope(url) as session:
        due = session.execute(
            select(HookDelivery.id, HookDelivery.attempts, HookDelivery.event, HookDelivery.payload,
                   HookDelivery.created_at, Hook.id, Hook.url, Hook.secret)
            .join(Hook, Hook.id == HookDelivery.hook_id).where(*_due(now, skip_hooks))
            .order_by(HookDelivery.next_attempt_at).limit(limit)).all()
        claimed = []
        for delivery_id, attempts, event, payload, created_at, hook_id, hook_url, secret in due:
            taken = rowcount(session.execute(
                update(HookDelivery).where(HookDelivery.id == delivery_id,
                                           HookDelivery.attempts == attempts,
                                           HookDelivery.status.in_(SENDABLE),
                                           HookDelivery.next_attempt_at <= now)
                .values(attempts=attempts + 1, next_attempt_at=now + LEASE)))
            if taken:  # the row as read is the row claimed: only the attempts and the lease moved
                claimed.append(Claimed(delivery_id, attempts + 1, event, dict(payload),
                                       iso(created_at), hook_id, hook_url, secret))
        return claimed


def one_line(text: str) -> str:
    """An error as one line of at most MAX_ERROR_CHARS characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_ERROR_CHARS else flat[:MAX_ERROR_CHARS - 1] + "…"


def settle(url: str, claimed: Claimed, now: datetime, code: int | None, error: str | None) -> str | None:
    """Record an attempt's answer: a 2xx delivers; anything else (another status, a refusal, a
    timeout) waits `backoff` for the next try, or gives up past `expires_at`. Only the attempt
    claimed may settle (a later claim or a redelivery by hand made meanwhile keeps its own).
    The delivery's new status, or None when it was not this attempt's any more."""
    ok = code is not None and 200 <= code < 300
    with session_scope(url) as session:
        expires = session.scalar(select(HookDelivery.expires_at).where(
            HookDelivery.id == claimed.id, HookDelivery.attempts == claimed.attempt))
        if expires is None:
            return None
        later = now + backoff(claimed.attempt)
        status = DELIVERED if ok else GAVE_UP if later > as_utc(expires) else FAILED
        values: dict[str, object] = {"status": status, "last_code": code,
                                  "last_error": None if ok else one_line(error or f"answered {code}")}
        if ok:
            values["delivered_at"] = now
        else:
            values["next_attempt_at"] = later
        done = rowcount(session.execute(update(HookDelivery).where(
            HookDelivery.id == claimed.id, HookDelivery.attempts == claimed.attempt).values(**values)))
    return status if done else None


def delivery_record(d: HookDelivery) -> DeliveryRecord:
    return {"id": d.id, "hook_id": d.hook_id, "event": d.event, "status": DeliveryStatus(d.status),
            "attempts": d.attempts, "last_code": d.last_code, "last_error": d.last_error,
            "created_at": iso(d.created_at), "next_attempt_at": iso(d.next_attempt_at),
            "expires_at": iso(d.expires_at), "delivered_at": iso(d.delivered_at),
            "payload": d.payload}


def list_deliveries(url: str, hook_id: int | None = None, status: str | None = None,
                    limit: int = 100) -> list[DeliveryRecord]:
    """Deliveries, newest first, of one endpoint or all, in one status or any."""
    if status is not None and status not in DELIVERY_STATUSES:
        raise UserError(f"unknown delivery status {status!r}; one of {', '.join(DELIVERY_STATUSES)}")
    q = select(HookDelivery).order_by(HookDelivery.created_at.desc(), HookDelivery.id).limit(limit)
    if hook_id is not None:
        q = q.where(HookDelivery.hook_id == hook_id)
    if status is not None:
        q = q.where(HookDelivery.status == status)
    with session_scope(url) as session:
        return [delivery_record(d) for d in session.scalars(q)]


def redeliver(url: str, delivery_id: str, now: datetime | None = None) -> DeliveryRecord:
    """Queue a new attempt of a delivery now, whatever its status (delivered, given up): the
    receiver gets the same delivery id again, and a failed attempt is retried for a day more."""
    at = now or utcnow()
    with session_scope(url) as session:
        done = rowcount(session.execute(update(HookDelivery).where(HookDelivery.id == delivery_id)
                                        .values(status=PENDING, next_attempt_at=at,
                                                expires_at=at + WINDOW)))
        if not done:
            raise DeliveryNotFound(f"no webhook delivery {delivery_id!r} (`mxq hooks deliveries` "
                                   "lists them)")
        return delivery_record(session.get_one(HookDelivery, delivery_id))
