"""What the retention policy reads and writes (`mxq.workers.retention` applies it): which
jobs are finished, which inference outputs are older than the policy keeps, which versions lie
beyond the newest it keeps, and the marks it leaves (`output_removed_at`, `removed_at`) so that
the history says what went, when. A pin (`mxq pin`) keeps a job's output whatever the policy."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from mxq.db.engine import rowcount, session_scope
from mxq.db.records import JobRecord
from mxq.db.reports.history import job_record
from mxq.db.schema import Job, Model, Prediction, Schedule, utcnow
from mxq.errors import NotFound
from mxq.status import FINISHED, JobStatus

ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)


@dataclass(frozen=True)
class ExpiredOutput:
    """A finished inference job (not a chunk: chunks' rows belong to their parent) whose
    output is older than the policy keeps."""

    job_id: int
    output: str | None  # what its result names (a file here, an object, or "db")


def finished(url: str, ids: set[int]) -> dict[int, dict[str, object]]:
    """Of the jobs `ids`, those in a final status: id -> (kind, status, registered version)."""
    if not ids:
        return {}
    with session_scope(url) as session:
        rows = session.execute(select(Job.id, Job.kind, Job.status, Job.result)
                               .where(Job.id.in_(ids), Job.status.in_(FINISHED))).all()
    return {r.id: {"kind": r.kind, "status": r.status,
                   "registered": (r.result or {}).get("model_version") is not None} for r in rows}


def expired_outputs(url: str, before: datetime, limit: int = 1000) -> list[ExpiredOutput]:
    """Unpinned inference jobs finished before `before` whose output is still there."""
    with session_scope(url) as session:
        rows = session.execute(
            select(Job.id, Job.result).where(Job.status.in_(FINISHED), Job.finished_at < before,
                                             Job.kind == "infer", Job.parent_id.is_(None),
                                             Job.pinned.is_(False), Job.output_removed_at.is_(None))
            .order_by(Job.id).limit(limit)).all()
    return [ExpiredOutput(r.id, (r.result or {}).get("output")) for r in rows]


def mark_output_removed(url: str, job_id: int) -> int | None:
    """Delete a job's prediction rows and mark it and its chunks as having lost their output,
    unless it was pinned meanwhile: the rows deleted, None when it was pinned (nothing done).
    Marked before its files go: a pin that lands meanwhile keeps them."""
    with session_scope(url) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.pinned:
            return None
        gone = sum(session.scalars(delete(Prediction).where(Prediction.job_id == job_id)
                                   .returning(Prediction.samples)))
        session.execute(update(Job).where(or_(Job.id == job_id, Job.parent_id == job_id))
                        .values(output_removed_at=utcnow()))
        return gone


def set_pinned(url: str, job_id: int, pinned: bool) -> JobRecord:
    """Pin (or unpin) a job's output; the job's record. Who may is checked by the caller."""
    with session_scope(url) as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"unknown job {job_id}")
        job.pinned = pinned
        session.flush()
        return job_record(job)


@dataclass(frozen=True)
class OldVersion:
    """An unpromoted version beyond the newest the policy keeps, and its recorded files."""

    name: str
    version: int
    files: list[str]


def _files(m: Model) -> list[str]:
    named = [m.params_file, m.symbol_file, (m.onnx or {}).get("file"),
             *((v or {}).get("file") for v in (m.variants or {}).values())]
    return [f for f in named if isinstance(f, str) and f]


# Where a job's or a schedule's parameters name a model version: an inference's model, a
# training's `--from` (`mxq train --from m:1`).
_NAMES_VERSION = (("model", "model_version"), ("from_model", "from_version"))


def _in_use(session: Session) -> set[tuple[object, object]]:
    """(model, version) of every version a queued or running job (inference, or a training
    from it) or any schedule (paused ones too) names: never removed under them."""
    named = [p for (p,) in session.execute(select(Job.params).where(Job.status.in_(ACTIVE)))]
    named += [spec for (spec,) in session.execute(select(Schedule.spec))]
    return {(p.get(model), p.get(version)) for p in named if isinstance(p, dict)
            for model, version in _NAMES_VERSION if p.get(version) is not None}


def versions_beyond(url: str, keep: int) -> list[OldVersion]:
    """Per model, the unpromoted versions older than its newest `keep`, not yet removed and
    named by no queued or running job and no schedule (`_in_use`)."""
    with session_scope(url) as session:
        used = _in_use(session)
        models = list(session.scalars(select(Model).order_by(Model.name, Model.version.desc())))
        seen: dict[str, int] = {}
        old: list[OldVersion] = []
        for m in models:
            seen[m.name] = seen.get(m.name, 0) + 1
            if seen[m.name] > keep and not m.promoted and m.removed_at is None \
                    and (m.name, m.version) not in used:
                old.append(OldVersion(m.name, m.version, _files(m)))
        return old


def mark_version_removed(url: str, name: str, version: int) -> bool:
    """Mark a version removed unless it was promoted meanwhile; whether it was marked."""
    with session_scope(url) as session:
        done = session.execute(update(Model).where(Model.name == name, Model.version == version,
                                                   Model.promoted.is_(False),
                                                   Model.removed_at.is_(None))
                               .values(removed_at=utcnow()))
        return rowcount(done) > 0
