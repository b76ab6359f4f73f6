"""The bytes a model version scored for an inference schedule, each once per schedule
(`scored_inputs`).

A fire claims an input before it submits its job: the claim is a row unique per (schedule,
model, version, identity), so two fires of one schedule (a tick and the reconciler finishing a
fire that seemed lost) never make two jobs of the same bytes, while another schedule, another
user's perhaps, over the same bytes makes its own job and learns nothing of this one's (each
reads only its own claims); the job is then submitted with an idempotency key made
from the claim (`key_of`), so a fire that died between the submit and `settle` finds its job
again instead of making a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, exists, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from mxq.db.engine import session_scope
from mxq.db.schema import ScoredInput


@dataclass(frozen=True)
class Sighting:
    """An input as a fire saw it: where, its bytes' identity and size, a local file's mtime."""

    location: str
    identity: str
    size: int
    mtime_ns: int | None = None


@dataclass(frozen=True)
class Claim:
    """A claimed input: its row, and the job (or refusal) an earlier fire already made of it."""

    id: int
    job_id: int | None
    error: str | None

    @property
    def settled(self) -> bool:
        return self.job_id is not None or self.error is not None


def key_of(claim_id: int) -> str:
    """The idempotency key of the job that scores a claim (`mxq:` keeps it apart from users' keys
    only by convention: a user's own key of this form would meet the same owner's claim)."""
    return f"mxq:scored:{claim_id}"


@dataclass(frozen=True)
class Scorer:
    """Who scores: a schedule, with the model version its fire scores with."""

    schedule_id: int
    model: str
    version: int

    def rows(self) -> tuple[ColumnElement[bool], ...]:
        return (ScoredInput.schedule_id == self.schedule_id, ScoredInput.model == self.model,
                ScoredInput.version == self.version)


def seen(url: str, by: Scorer, location: str, size: int, mtime_ns: int) -> bool:
    """Whether the schedule scored, with its version, the bytes last seen at this local path
    with this size and mtime (their job made, or refused): a fire then skips the file without
    reading it to hash it. A claim still waiting for its job is not seen: the fire finishes it."""
    return _settled(url, by, ScoredInput.location == location, ScoredInput.size == size,
                    ScoredInput.mtime_ns == mtime_ns)


def _settled(url: str, by: Scorer, *where: ColumnElement[bool]) -> bool:
    """Whether the schedule's version has a claim matching `where` whose job was made (or
    refused)."""
    with session_scope(url) as session:
        return bool(session.scalar(select(exists().where(
            *by.rows(), *where, or_(ScoredInput.job_id.is_not(None), ScoredInput.error.is_not(None))))))


def claim(url: str, by: Scorer, sighting: Sighting, fire_id: int) -> Claim:
    """The schedule's claim on these bytes for its version: made now, or the one an earlier fire
    of it made (whose location then moves to where they are now: a renamed file is skipped
    unread next time)."""
    try:
        with session_scope(url) as session:
            row = ScoredInput(model=by.model, version=by.version, identity=sighting.identity,
                              location=sighting.location, size=sighting.size,
                              mtime_ns=sighting.mtime_ns, schedule_id=by.schedule_id, fire_id=fire_id)
            session.add(row)
            session.flush()
            return Claim(row.id, None, None)
    except IntegrityError:
        pass
    with session_scope(url) as session:
        row = session.scalars(select(ScoredInput).where(
            *by.rows(), ScoredInput.identity == sighting.identity)).one()
        row.location, row.mtime_ns = sighting.location, sighting.mtime_ns
        return Claim(row.id, row.job_id, row.error)


def settle(url: str, claim_id: int, job_id: int | None, error: str | None = None) -> None:
    """The job that scores the claimed bytes, or why the submit refused them (not retried)."""
    with session_scope(url) as session:
        session.execute(update(ScoredInput).where(ScoredInput.id == claim_id)
                        .values(job_id=job_id, error=error))


def release(url: str, claim_id: int) -> None:
    """Drop a claim whose input went away before its job was made: it was never scored."""
    with session_scope(url) as session:
        session.execute(delete(ScoredInput).where(ScoredInput.id == claim_id,
                                                  ScoredInput.job_id.is_(None)))


def jobs_of_fire(url: str, fire_id: int) -> list[int]:
    """The jobs an inference fire submitted, in the order it submitted them."""
    with session_scope(url) as session:
        made = session.scalars(select(ScoredInput.job_id).where(ScoredInput.fire_id == fire_id)
                               .order_by(ScoredInput.id))
        return [job_id for job_id in made if job_id is not None]


def has(url: str, by: Scorer, identity: str) -> bool:
    """Whether the schedule scored these bytes with its version (their job made, or refused)."""
    return _settled(url, by, ScoredInput.identity == identity)
