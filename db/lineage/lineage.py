"""What produced each prediction set, read from the `prediction_lineage` view (migrations 0034,
0035), which BI tools and `psql` read as well: one row per inference job with its model,
version, variant, engine, input identity, output location (and when `mxq gc` removed it) and
mxq's version."""

from __future__ import annotations

from typing import cast

from sqlalchemy import DateTime, Integer, RowMapping, String, case, column, distinct, func, or_, select, table
from sqlalchemy.sql.elements import ColumnElement

from mxq.db.engine import session_scope
from mxq.db.records import LineageRecord, VersionScored
from mxq.db.schema import iso
from mxq.errors import NotFound
from mxq.status import JobStatus

_TEXT = ("status", "owner", "team", "model", "variant", "engine", "input", "input_identity",
         "input_bytes", "output_format", "output", "mxq_version", "schedule")
VIEW = table("prediction_lineage", column("job_id", Integer), column("model_version", Integer),
             column("fire_id", Integer), *(column(name, String) for name in _TEXT),
             column("submitted_at", DateTime(timezone=True)),
             column("finished_at", DateTime(timezone=True)),
             column("output_removed_at", DateTime(timezone=True)))
MOST = 10_000  # rows one read returns at most


class NoLineage(NotFound):
    """A job that is not an inference job's top level (a training, a chunk, an unknown id)."""


def _record(row: RowMapping) -> LineageRecord:
    found = {**row, "status": JobStatus(row["status"]), "submitted_at": iso(row["submitted_at"]),
             "finished_at": iso(row["finished_at"]), "output_removed_at": iso(row["output_removed_at"])}
    return cast(LineageRecord, found)  # the view's columns are the record's keys


def _rows(url: str, *where: ColumnElement[bool], limit: int = MOST) -> list[LineageRecord]:
    with session_scope(url) as session:
        q = select(VIEW).where(*where).order_by(VIEW.c.job_id).limit(limit)
        return [_record(r) for r in session.execute(q).mappings()]


def of_job(url: str, job_id: int) -> LineageRecord:
    """What produced job `job_id`'s output."""
    found = _rows(url, VIEW.c.job_id == job_id)
    if not found:
        raise NoLineage(f"job {job_id} has no lineage: lineage covers inference jobs (a chunked "
                        "job's parent, not its chunks)")
    return found[0]


Reader = tuple[str, frozenset[str]]  # a user's name and teams: what `mxq.users.may_read` lets it read


def _readable(reader: Reader | None) -> list[ColumnElement[bool]]:
    """The rows `reader` may read (its own, its teams'), in SQL, so that a LIMIT counts only
    those; None (an admin, the local CLI): every row."""
    if reader is None:
        return []
    name, teams = reader
    return [or_(VIEW.c.owner == name, VIEW.c.team.in_(sorted(teams)))]


def prediction_sets(url: str, model: str | None = None, version: int | None = None,
                    output: str | None = None, limit: int = MOST, reader: Reader | None = None,
                    after: int = 0) -> tuple[list[LineageRecord], bool]:
    """The prediction sets model `model`'s version `version` produced, or the one whose output
    is `output` (a file's path, an s3:// URL): each filter given narrows; none, every set. Of
    those `reader` may read, by job id from above `after`, at most `limit`; and whether more
    follow (read on from the last one's job id)."""
    where = [c == v for c, v in ((VIEW.c.model, model), (VIEW.c.model_version, version),
                                 (VIEW.c.output, output and output.rstrip("/"))) if v is not None]
    limit = min(limit, MOST)
    rows = _rows(url, *where, *_readable(reader), VIEW.c.job_id > after, limit=limit + 1)
    return rows[:limit], len(rows) > limit


def versions_scored(url: str, reader: Reader | None = None) -> list[VersionScored]:
    """Per model version, how many prediction sets it produced and over how many distinct
    inputs (the dashboard's versions panel): of every job, or (`reader`: a user's name and
    teams) only of those the user may read."""
    where = _readable(reader)
    inputs = func.count(distinct(func.coalesce(VIEW.c.input_bytes, VIEW.c.input)))
    q = (select(VIEW.c.model, VIEW.c.model_version, func.count(), inputs,
                func.sum(case((VIEW.c.status == "succeeded", 1), else_=0)))
         .where(VIEW.c.model.is_not(None), *where)
         .group_by(VIEW.c.model, VIEW.c.model_version).order_by(VIEW.c.model, VIEW.c.model_version))
    with session_scope(url) as session:
        return [{"model": str(m), "version": int(v or 0), "prediction_sets": int(n),
                 "inputs": int(i), "succeeded": int(ok or 0)}
                for m, v, n, i, ok in session.execute(q)]
