"""What produced each prediction set, read from the `prediction_lineage` view (migration 0034),
which BI tools and `psql` read as well: one row per inference job with its model, version,
variant, engine, input identity, output location and mxq's version."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import DateTime, Integer, String, case, column, distinct, func, or_, select, table
from sqlalchemy.sql.elements import ColumnElement

from mxq.db.engine import session_scope
from mxq.db.records import LineageRecord, VersionScored
from mxq.db.schema import iso
from mxq.errors import NotFound

_TEXT = ("status", "owner", "team", "model", "variant", "engine", "input", "input_identity",
         "input_bytes", "output_format", "output", "mxq_version", "schedule")
VIEW = table("prediction_lineage", column("job_id", Integer), column("model_version", Integer),
             column("fire_id", Integer), *(column(name, String) for name in _TEXT),
             column("submitted_at", DateTime(timezone=True)),
             column("finished_at", DateTime(timezone=True)))
MOST = 10_000  # rows one read returns at most


class NoLineage(NotFound):
    """A job that is not an inference job's top level (a training, a chunk, an unknown id)."""


def _record(row: Any) -> LineageRecord:
    found = {**row._mapping, "submitted_at": iso(row.submitted_at),
             "finished_at": iso(row.finished_at)}
    return cast(LineageRecord, found)  # the view's columns are the record's keys


def _rows(url: str, *where: ColumnElement[bool], limit: int = MOST) -> list[LineageRecord]:
    with session_scope(url) as session:
        q = select(VIEW).where(*where).order_by(VIEW.c.job_id).limit(min(limit, MOST))
        return [_record(r) for r in session.execute(q)]


def of_job(url: str, job_id: int) -> LineageRecord:
    """What produced job `job_id`'s output."""
    found = _rows(url, VIEW.c.job_id == job_id)
    if not found:
        raise NoLineage(f"job {job_id} has no lineage: lineage covers inference jobs (a chunked "
                        "job's parent, not its chunks)")
    return found[0]


def prediction_sets(url: str, model: str | None = None, version: int | None = None,
               output: str | None = None, limit: int = MOST) -> list[LineageRecord]:
    """The prediction sets model `model`'s version `version` produced, or the one whose output
    is `output` (a file's path, an s3:// URL): each filter given narrows; none, every set."""
    where = [c == v for c, v in ((VIEW.c.model, model), (VIEW.c.model_version, version),
                                 (VIEW.c.output, output and output.rstrip("/"))) if v is not None]
    return _rows(url, *where, limit=limit)


def versions_scored(url: str, reader: tuple[str, frozenset[str]] | None = None) -> list[VersionScored]:
    """Per model version, how many prediction sets it produced and over how many distinct
    inputs (the dashboard's versions panel): of every job, or (`reader`: a user's name and
    teams) only of those the user may read."""
    where: list[ColumnElement[bool]] = []
    if reader is not None:
        name, teams = reader
        where.append(or_(VIEW.c.owner == name, VIEW.c.team.in_(sorted(teams))))
    inputs = func.count(distinct(func.coalesce(VIEW.c.input_bytes, VIEW.c.input)))
    q = (select(VIEW.c.model, VIEW.c.model_version, func.count(), inputs,
                func.sum(case((VIEW.c.status == "succeeded", 1), else_=0)))
         .where(VIEW.c.model.is_not(None), *where)
         .group_by(VIEW.c.model, VIEW.c.model_version).order_by(VIEW.c.model, VIEW.c.model_version))
    with session_scope(url) as session:
        return [{"model": str(m), "version": int(v or 0), "prediction_sets": int(n),
                 "inputs": int(i), "succeeded": int(ok or 0)}
                for m, v, n, i, ok in session.execute(q)]
