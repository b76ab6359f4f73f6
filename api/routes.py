"""`/api/v1`: jobs, predictions, devices, models, schedules. Every request is made as a user,
found by its bearer token or dashboard session (`mxq.api.auth`): reads by any user, writes as
its role allows. History rows are every user's; a job's results (its `result`, predictions and
outputs) are read by its owner, its team's members and admins (`Caller.may_read`). Bodies and
answers are typed in `mxq.api.schemas`; each route declares the errors it can answer, all as
problem documents (`mxq.api.app`)."""

from __future__ import annotations

import csv
import io
from http import HTTPStatus
from typing import Annotated, Any, Literal, cast

import numpy as np
from fastapi import APIRouter, Body, Depends, Header, Path, Query, Response

from mxq.api.auth import Caller, admin, reader, submitter
from mxq.api.auth import settings as settings  # re-exported: tests override routes.settings
from mxq.api.schemas import (
    SINCE_AGE_PATTERN,
    ArchRecord,
    ArchRequest,
    CancelAnswer,
    DeviceRecord,
    InferScheduleRequest,
    JobPage,
    JobRecord,
    JobRequest,
    LogPage,
    ModelRecord,
    PredictionPage,
    Problem,
    PromoteRequest,
    QueueEntry,
    ScheduleDetail,
    ScheduleRecord,
    ScheduleRequest,
    Status,
    SubmitAnswer,
    TrainJob,
)
from mxq.db import registry, schedules
from mxq.db.outputs import logs, results, retention
from mxq.db.reports.history import JobFilter, count_jobs, list_jobs, require_job
from mxq.db.schema import utcnow
from mxq.errors import Unavailable
from mxq.names import MAX_ID
from mxq.priorities import Priority
from mxq.since import parse_since
from mxq.workers.broker.health import broker_problem
from mxq.workers.fleet.device_table import device_table
from mxq.workers.jobs.archs import queue_trial
from mxq.workers.jobs.cancel import cancel_job
from mxq.workers.jobs.jobspecs import InferRequest, TrainOptions
from mxq.workers.jobs.queue_view import queue_view
from mxq.workers.jobs.submit import IDEMPOTENCY_KEY_PATTERN, SubmitOptions, submit_jobs
from mxq.workers.schedules.cron import every
from mxq.workers.schedules.fires import add_schedule, request_fire, resume
from mxq.workers.schedules.scoring import add_infer_schedule
from mxq.workers.settings import Settings

router = APIRouter(prefix="/api/v1")
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
Name = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]
# A filter compared with a column: PostgreSQL refuses a NUL in any string (a 500 from a fuzzer's
# `?user=%00`), so the schema refuses it first, 422.
NO_NUL = r"^[^\x00]*$"
Filter = Annotated[str | None, Query(max_length=128, pattern=NO_NUL)]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]


def problems(*statuses: int) -> dict[int | str, dict[str, object]]:
    """The OpenAPI entries of the errors a route can answer: each a Problem document (every
    route needs a user: 401, 403)."""
    return {status: {"model": Problem, "description": HTTPStatus(status).phrase}
            for status in sorted({*statuses, *READ_ERRORS, 421, 422, 503})}


def _visible(who: Caller, record: JobRecord) -> JobRecord:
    """A job's record as `who` may see it: whole for its owner, team and admins; for another
    user, the history row without its results (`result`, `output` null)."""
    if who.may_read(record["owner"], record["team"]):
        return record
    shown = record.copy()
    shown["result"] = None
    shown["output"] = None
    return shown


Reader = Annotated[Caller, Depends(reader)]
Submitter = Annotated[Caller, Depends(submitter)]
Admin = Annotated[Caller, Depends(admin)]
READ_ERRORS = (401, 403)  # (403: a dashboard session's write without its CSRF token, others' results)
WRITE_ERRORS = (401, 403, 413, 415)  # (403, 415: api/guard.py)
# The job list counts matches this far past its page: a total of millions (every job, every
# success) would cost a read of each one on every refresh of the dashboard.
TOTAL_COUNTED = 10_000


@router.get("/jobs", response_model=JobPage, responses=problems())
def jobs(status: Status | None = None, kind: Filter = None, device: Filter = None,
         node: Filter = None,
         since: Annotated[str | None, Query(
             description="An age (45s, 30m, 2h, 1d) or an ISO 8601 date or time (UTC unless it "
             "names a zone).", json_schema_extra={"anyOf": [
                 {"type": "string", "pattern": SINCE_AGE_PATTERN},
                 {"type": "string", "format": "date-time"}, {"type": "string", "format": "date"}]})] = None,
         limit: Annotated[int, Query(ge=1, le=1000)] = 50,
         offset: Offset = 0,
         before_id: Annotated[int | None, Query(
             ge=1, le=MAX_ID, description="Keyset paging: only jobs whose id is below this, "
             "highest id first. Pass the last id of a page to get the next one (start with "
             f"{MAX_ID}): unlike offset, submits meanwhile neither repeat nor skip a job.")] = None,
         user: Annotated[str | None, Query(
             max_length=128, pattern=NO_NUL, description="Who submitted it: a user's name, `admin` "
             "(MXQ_API_TOKEN), `local:LOGIN` (the CLI on the stack's machine).")] = None,
         who: Caller = Depends(reader), s: Settings = Depends(settings)) -> JobPage:
    """Job history, newest first, filtered like `mxq jobs`, in pages (another user's jobs without
    their results)."""
    f = JobFilter(status, kind, device, node, None if since is None else parse_since(since, utcnow()),
                  limit, offset, before_id, owner=user)
    counted = offset + limit + TOTAL_COUNTED
    total = count_jobs(s.database, f, at_most=counted)
    return {"items": [_visible(who, j) for j in list_jobs(s.database, f)], "total": min(total, counted),
            "total_capped": total > counted, "limit": limit, "offset": offset}


IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", description="Makes a retry safe: a submit with a key used before "
    "answers 200 with the job that first submit made (`replayed`, header Idempotent-Replayed: "
    "true) instead of queuing another; the same key with other parameters is a 409. At most 128 "
    "of A-Z a-z 0-9 . _ : + / = - (a UUID fits).",
    json_schema_extra={"pattern": IDEMPOTENCY_KEY_PATTERN, "maxLength": 128})]


@router.post("/jobs", status_code=201, response_model=SubmitAnswer,
             responses={200: {"model": SubmitAnswer, "description": "A replay: the job an earlier "
                              "submit with this Idempotency-Key made"},
                        **problems(409, *WRITE_ERRORS)})
def submit_job(req: Annotated[JobRequest, Body(title="JobRequest")], response: Response,
               who: Submitter, idempotency_key: IdempotencyKey = None,
               s: Settings = Depends(settings)) -> SubmitAnswer:
    """Queue a job. A request the schema refuses is answered 422 and recorded nowhere; one that
    fits but cannot run (an unknown model, an input outside the data root or over the size
    limit, devices this node lacks) is recorded as a failed job: 422 with its `job_id`. A broker
    that does not answer within MXQ_BROKER_TIMEOUT_SECONDS leaves the job queued with
    `published` false: the reconciler publishes it."""
    device = req.device_list[0] if isinstance(req, TrainJob) and req.device_list else req.device
    [done] = submit_jobs(s, [req], SubmitOptions(
        device, req.allow_offline, idempotency_key, who.name,
        Priority.of(req.priority, req.preemptible), req.team, req.after))
    if done.replayed:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    return {**require_job(s.database, done.job_id), "published": done.published,
            "replayed": done.replayed, "note": done.note}


@router.get("/queue", response_model=list[QueueEntry], responses=problems())
def waiting_queue(limit: Annotated[int, Query(ge=1, le=1000, description="At most this many, "
                                              "the first ones.")] = 100,
                  _: Caller = Depends(reader), s: Settings = Depends(settings)) -> list[QueueEntry]:
    """The waiting jobs in the order workers take them (priority, then a job that started
    before, then the oldest), each with its `position` and `why` it waits."""
    return queue_view(s, limit)


@router.get("/jobs/{job_id}", response_model=JobRecord, responses=problems(404))
def job(job_id: JobId, points: Annotated[int | None, Query(
            ge=2, le=100_000, description="At most this many throughput points per device: "
            "consecutive ones merged (samples and seconds summed). Default: every point.")] = None,
        who: Caller = Depends(reader), s: Settings = Depends(settings)) -> JobRecord:
    """One job with its throughput over time (and epochs, for training); another user's
    without its results."""
    return _visible(who, require_job(s.database, job_id, with_metrics=True, points=points))


@router.post("/jobs/{job_id}/cancel", response_model=CancelAnswer,
             responses=problems(404, *WRITE_ERRORS))
def cancel(job_id: JobId, who: Submitter, s: Settings = Depends(settings)) -> CancelAnswer:
    """Cancel at once if queued, at the next batch or epoch boundary if running: its owner or
    an admin."""
    who.may_change(require_job(s.database, job_id)["owner"], f"job {job_id}")
    outcome = cancel_job(s, job_id)
    # the enum's value is the answer's word (a missing job is a 404 before it is answered)
    said = cast(Literal["cancelled", "requested", "finished"], outcome.value)
    return {"outcome": said, **require_job(s.database, job_id)}


@router.put("/jobs/{job_id}/pin", response_model=JobRecord, responses=problems(403, 404))
def pin(job_id: JobId, who: Submitter, s: Settings = Depends(settings)) -> JobRecord:
    """Keep the job's output whatever the retention policy (MXQ_KEEP_OUTPUT_DAYS) says: its
    owner or an admin."""
    return _set_pin(job_id, who, s, True)


@router.delete("/jobs/{job_id}/pin", response_model=JobRecord, responses=problems(403, 404))
def unpin(job_id: JobId, who: Submitter, s: Settings = Depends(settings)) -> JobRecord:
    """Let the retention policy remove the job's output again when it is old enough."""
    return _set_pin(job_id, who, s, False)


def _set_pin(job_id: int, who: Caller, s: Settings, pinned: bool) -> JobRecord:
    """A job's pin set by its owner or an admin (403 for anyone else, 404 for no such job)."""
    who.may_change(require_job(s.database, job_id)["owner"], f"job {job_id}")
    return retention.set_pinned(s.database, job_id, pinned)


@router.get("/jobs/{job_id}/predictions", response_model=PredictionPage, responses={
    **problems(404), 200: {"description": "A page of predictions: JSON, or with format=csv the CSV "
                           "`mxq results --format csv` prints",
                           "content": {"text/csv": {"schema": {"type": "string"}}}}})
def job_predictions(job_id: JobId, limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
                    offset: Offset = 0, format: Literal["json", "csv"] = "json",
                    who: Caller = Depends(reader),
                    s: Settings = Depends(settings)) -> PredictionPage | Response:
    """Predictions `offset` onwards, ordered by sample index: to the job's owner, its team's
    members and admins (403 to anyone else)."""
    record = require_job(s.database, job_id)
    who.check_read(record["owner"], record["team"], f"the predictions of job {job_id}")
    rows = results.read(s.database, s.home_path, record, limit, offset)
    if format == "json":
        return {"items": rows, "total": results.count(s.database, s.home_path, record),
                "limit": limit, "offset": offset}
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(results.prediction_csv(rows))
    return Response(out.getvalue(), media_type="text/csv")


NPY = "application/x-npy"


@router.get("/jobs/{job_id}/values", response_class=Response, responses={
    **problems(404), 200: {"description": "Rows of one output's values as a NumPy .npy file "
                           "((rows, width) float32); `X-Total-Rows` says how many the output holds",
                           "content": {NPY: {"schema": {"type": "string", "format": "binary"}}}}})
def job_values(job_id: JobId, output: Annotated[str | None, Query(
                   max_length=32, pattern=r"^[A-Za-z][A-Za-z0-9_]*$", description="The output's "
                   "name (a model with several outputs); default: the model's only one.")] = None,
               limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000, offset: Offset = 0,
               who: Caller = Depends(reader), s: Settings = Depends(settings)) -> Response:
    """The values a job stored for one output of its model (an embedding, regression values, a
    classifier's probabilities kept in an .npy), rows `offset` onwards, as an .npy file: to the
    job's owner, its team's members and admins (403 to anyone else)."""
    record = require_job(s.database, job_id)
    who.check_read(record["owner"], record["team"], f"the outputs of job {job_id}")
    rows, total = results.values(s.database, s.home_path, record, output, limit, offset)
    out = io.BytesIO()
    np.save(out, rows, allow_pickle=False)
    return Response(out.getvalue(), media_type=NPY, headers={"X-Total-Rows": str(total)})


@router.get("/jobs/{job_id}/logs", response_model=LogPage, responses=problems(404))
def job_logs(job_id: JobId, after: Annotated[int, Query(
                 ge=0, le=MAX_ID, description="Only the lines numbered above this: pass the last "
                 "page's `next` to read on (a dropped line's number is never reused).")] = 0,
             limit: Annotated[int, Query(ge=1, le=logs.MOST_READ)] = 1000,
             who: Caller = Depends(reader), s: Settings = Depends(settings)) -> LogPage:
    """What the job printed (its training child's stdout and stderr, its worker's log lines
    while it ran, mxq's notes), numbered, after `after`: to the job's owner, its team's members
    and admins (403 to anyone else). `ended`: the job finished and its last line is written."""
    record = require_job(s.database, job_id)
    who.check_read(record["owner"], record["team"], f"the log of job {job_id}")
    return logs.read(s.database, job_id, after, limit)


@router.get("/devices", response_model=list[DeviceRecord], responses=problems())
def devices(_: Reader, s: Settings = Depends(settings)) -> list[dict[str, Any]]:
    """Every device worker: live state, queue depth, the job holding it, heartbeat age. The
    health check: 503, a problem saying which, when the broker or the database is unreachable."""
    problem = broker_problem(s)
    if problem:
        raise Unavailable(problem)
    return device_table(s)


@router.get("/models", response_model=list[ModelRecord], responses=problems())
def models(_: Reader, s: Settings = Depends(settings)) -> list[ModelRecord]:
    """Every version of every model."""
    return registry.list_models(s.database)


@router.get("/models/{name}", response_model=list[ModelRecord], responses=problems(404))
def model_versions(name: Name, _: Reader, s: Settings = Depends(settings)) -> list[ModelRecord]:
    """The versions of one model."""
    registry.resolve(s.database, name)  # 404 for an unknown name
    return registry.list_models(s.database, name)


@router.post("/models/{name}/promote", response_model=ModelRecord,
             responses=problems(404, *WRITE_ERRORS))
def promote(name: Name, req: PromoteRequest, who: Submitter, s: Settings = Depends(settings)) -> ModelRecord:
    """Make a version the one inference uses by default: its owner, its team's members (role
    submit) and admins may."""
    registry.resolve(s.database, name)  # 404, naming the models there are
    registry.check_registrant(s.database, name, who.name)  # the rule a training's registration meets
    return registry.promote(s.database, name, req.version)


@router.get("/archs", response_model=list[ArchRecord], responses=problems())
def archs(_: Reader, s: Settings = Depends(settings)) -> list[ArchRecord]:
    """Every version of every registered architecture (`mxq arch ls`): a training of NAME uses
    its newest."""
    return registry.list_archs(s.database)


@router.post("/archs", status_code=202, response_model=JobRecord, responses=problems(*WRITE_ERRORS))
def add_arch(req: ArchRequest, who: Admin, s: Settings = Depends(settings)) -> JobRecord:
    """Register an architecture's code (admins only): its trial is queued as an `arch` job (the
    answer), which a device worker runs in a child process; once it succeeds, its `result.arch`
    is the registered version and a training may name it. A refused trial fails the job with its
    one-line reason (`error`), and nothing is registered. Needs device workers running."""
    job_id = queue_trial(s, req.name, req.code.encode(), req.file_name, req.factory, req.classes,
                         req.input_shape, who.name)
    return require_job(s.database, job_id)


@router.delete("/archs/{name}", status_code=204, responses=problems(404, *WRITE_ERRORS))
def delete_arch(name: Name, _: Admin, s: Settings = Depends(settings)) -> Response:
    """Forget architecture NAME, every version (admins only); trainings already submitted keep
    the code they pinned."""
    registry.remove_arch(s.database, name)
    return Response(status_code=204)


@router.get("/schedules", response_model=list[ScheduleRecord], responses=problems())
def list_schedules(_: Reader, s: Settings = Depends(settings)) -> list[ScheduleRecord]:
    """Every schedule with its next fire time."""
    return schedules.list_schedules(s.database)


@router.post("/schedules", status_code=201, response_model=ScheduleRecord,
             responses=problems(409, *WRITE_ERRORS))
def create_schedule(req: ScheduleRequest, who: Submitter, s: Settings = Depends(settings)) -> ScheduleRecord:
    """A schedule: its own fields plus the options of the training it fires (`model` is the
    name the training registers)."""
    spec = {**req.model_dump(include=set(TrainOptions.model_fields)), "name": req.model}
    return add_schedule(s, req.name, req.cron, req.tz, req.dataset, spec, req.promote, req.metric,
                        req.min_gain, owner=who.name,
                        priority=Priority.of(req.priority, req.preemptible), team=req.team,
                        min_metric=req.min_metric)


@router.post("/schedules/inference", status_code=201, response_model=ScheduleRecord,
             responses=problems(404, 409, *WRITE_ERRORS))
def create_inference_schedule(req: InferScheduleRequest, who: Submitter,
                              s: Settings = Depends(settings)) -> ScheduleRecord:
    """An inference schedule: each fire scores every file of `input` that `model`'s version has
    not scored yet, once, a job each, as `who`."""
    request = req.model_dump(include=set(InferRequest.model_fields) - {"input"})
    timing = req.cron if req.cron is not None else every(req.every or "")
    return add_infer_schedule(s, req.name, timing, req.tz, req.input, request, req.device,
                              req.rescore, owner=who.name,
                              priority=Priority.of(req.priority, req.preemptible), team=req.team)


def _schedule(s: Settings, name: str) -> ScheduleDetail:
    return schedules.detail(s.database, name)


def _owned(s: Settings, who: Caller, name: str) -> None:
    """Forbidden unless `who` may change schedule `name` (404 for an unknown one)."""
    who.may_change(schedules.get(s.database, name)["owner"], f"schedule {name!r}")


@router.get("/schedules/{name}", response_model=ScheduleDetail, responses=problems(404))
def schedule(name: Name, _: Reader, s: Settings = Depends(settings)) -> ScheduleDetail:
    """One schedule and its fires, with their jobs, outcomes and promotion decisions."""
    return _schedule(s, name)


@router.post("/schedules/{name}/pause", response_model=ScheduleDetail,
             responses=problems(404, *WRITE_ERRORS))
def pause(name: Name, who: Submitter, s: Settings = Depends(settings)) -> ScheduleDetail:
    """Stop firing until resumed."""
    _owned(s, who, name)
    schedules.set_enabled(s.database, name, False)
    return _schedule(s, name)


@router.post("/schedules/{name}/resume", response_model=ScheduleDetail,
             responses=problems(404, *WRITE_ERRORS))
def resume_schedule(name: Name, who: Submitter, s: Settings = Depends(settings)) -> ScheduleDetail:
    """Fire again from the next cron time."""
    _owned(s, who, name)
    resume(s, name)
    return _schedule(s, name)


@router.post("/schedules/{name}/run-now", status_code=202,
             response_model=ScheduleDetail, responses=problems(404, *WRITE_ERRORS))
def fire_now(name: Name, who: Submitter, s: Settings = Depends(settings)) -> ScheduleDetail:
    """Fire once, now: the fire is recorded at once (listed last, with no job yet) and the
    schedule process resolves its dataset and submits its job."""
    _owned(s, who, name)
    request_fire(s, name)
    return _schedule(s, name)


@router.delete("/schedules/{name}", status_code=204,
               responses=problems(404, *WRITE_ERRORS))
def delete_schedule(name: Name, who: Submitter, s: Settings = Depends(settings)) -> Response:
    """Remove the schedule; its fires stay as the history of the jobs they started."""
    _owned(s, who, name)
    schedules.remove(s.database, name)
    return Response(status_code=204)
