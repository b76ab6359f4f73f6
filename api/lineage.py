"""`/api/v1` lineage: what produced a prediction set (`/jobs/{id}/lineage`), the sets a model's
version produced or the job that wrote an output (`/lineage`), and the inputs of an inference
schedule a version has not scored (`/schedules/{name}/unscored`). A job's lineage is its
results': its owner, its team and admins read it; a list holds only the rows the caller may read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from typing_extensions import TypedDict

from mxq.api.auth import settings
from mxq.api.routes import JobId, Name, Reader, problems
from mxq.db import schedules
from mxq.db.lineage import lineage
from mxq.db.records import LineageRecord, UnscoredInput, VersionScored
from mxq.names import MAX_ID
from mxq.users import Role
from mxq.workers.schedules.scoring import unscored
from mxq.workers.settings import Settings

router = APIRouter(prefix="/api/v1")


class Unscored(TypedDict):
    """The files of a schedule's input whose bytes `version` has not scored."""

    schedule: str
    version: int
    inputs: list[UnscoredInput]


@router.get("/jobs/{job_id}/lineage", response_model=LineageRecord, responses=problems(403, 404))
def job_lineage(job_id: JobId, who: Reader, s: Settings = Depends(settings)) -> LineageRecord:
    """What produced the inference job's output: model, version, variant, engine, the input's
    identity, where the output went, mxq's version, the schedule fire that made it."""
    record = lineage.of_job(s.database, job_id)
    who.check_read(record["owner"], record["team"], f"the lineage of job {job_id}")
    return record


@router.get("/lineage", response_model=list[LineageRecord], responses={**problems(), 200: {
    "description": "The rows; when more follow, a `Link: <…&after=JOB>; rel=\"next\"` header "
                   "(RFC 8288) gives the next page's URL",
    "headers": {"Link": {"schema": {"type": "string"}, "description": "The next page, if any"}}}})
def lineage_rows(request: Request, response: Response, who: Reader,
                 model: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
                 version: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                 output: Annotated[str | None, Query(min_length=1, max_length=4096)] = None,
                 limit: Annotated[int, Query(ge=1, le=lineage.MOST)] = 1000,
                 after: Annotated[int, Query(ge=0, le=MAX_ID, description="Only jobs above this "
                                             "id: the last row's `job_id`, to read on.")] = 0,
                 s: Settings = Depends(settings)) -> list[LineageRecord]:
    """The prediction sets `model` (its `version`) produced, or the job that wrote `output`,
    each filter narrowing (none: every set), of those the caller may read, by job id; a page of
    `limit`, and a `Link` header to the next while more follow."""
    reader = None if who.role is Role.ADMIN else (who.name, who.teams)
    rows, more = lineage.prediction_sets(s.database, model, version, output, limit, reader, after)
    if more:
        following = request.url.include_query_params(after=rows[-1]["job_id"])
        response.headers["Link"] = f'<{following}>; rel="next"'
    return rows


@router.get("/lineage/versions", response_model=list[VersionScored], responses=problems())
def versions_scored(who: Reader, s: Settings = Depends(settings)) -> list[VersionScored]:
    """Per model version, the prediction sets it produced and over how many inputs, counting the
    jobs the caller may read (the dashboard's versions panel)."""
    return lineage.versions_scored(s.database, None if who.role is Role.ADMIN else (who.name, who.teams))


@router.get("/schedules/{name}/unscored", response_model=Unscored, responses=problems(403, 404, 409))
def unscored_inputs(name: Name, who: Reader,
                    version: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                    s: Settings = Depends(settings)) -> Unscored:
    """The files of the inference schedule's input whose bytes `version` (default: the one it
    scores with now) has not scored; its owner, team and admins only (it lists their files)."""
    sched = schedules.get(s.database, name)
    who.check_read(sched["owner"], sched["team"], f"the inputs of schedule {name!r}")
    scoring_version, files = unscored(s, name, version)
    return {"schedule": name, "version": scoring_version, "inputs": files}
