"""`/api/v1`: jobs, predictions, devices, models, schedules. Reads are open; writes need the
bearer token when MXQ_API_TOKEN is set."""

from __future__ import annotations

import csv
import io
import secrets
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from mxq.db import registry, results, schedules
from mxq.db.history import JobFilter, count_jobs, list_jobs, require_job
from mxq.db.schema import utcnow
from mxq.since import parse_since
from mxq.workers.cancel import cancel_job
from mxq.workers.fires import add_schedule, resume, run_now
from mxq.workers.settings import Settings, get_settings
from mxq.workers.status import device_table
from mxq.workers.submit import submit

router = APIRouter(prefix="/api/v1")
Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


def settings() -> Settings:
    return get_settings()


def writer(authorization: Annotated[str | None, Header()] = None,
           s: Settings = Depends(settings)) -> None:
    """Writes need `Authorization: Bearer <MXQ_API_TOKEN>` (compared in constant time)."""
    token = s.api_token.get_secret_value() if s.api_token else None
    if token is None:
        return  # no token set: the server listens on loopback only
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), token.encode()):
        raise HTTPException(401, "this endpoint needs the header Authorization: Bearer <MXQ_API_TOKEN>",
                            headers={"WWW-Authenticate": "Bearer"})


Write = Depends(writer)


def _job_or_404(s: Settings, job_id: int, full: bool = False) -> dict[str, Any]:
    # Served as it is: the routes' responses are plain JSON objects in the API's spec.
    return cast(dict[str, Any], require_job(s.database, job_id, with_metrics=full))


@router.get("/jobs")
def jobs(status: Status | None = None, kind: str | None = None, device: str | None = None,
         node: str | None = None,
         since: Annotated[str | None, Query(description="An age (30m, 2h, 1d) or an ISO time.")] = None,
         limit: Annotated[int, Query(ge=1, le=1000)] = 50,
         offset: Annotated[int, Query(ge=0)] = 0, s: Settings = Depends(settings)) -> dict[str, Any]:
    """Job history, newest first, filtered like `mxq jobs`, in pages."""
    f = JobFilter(status, kind, device, node, None if since is None else parse_since(since, utcnow()),
                  limit, offset)
    return {"items": list_jobs(s.database, f), "total": count_jobs(s.database, f),
            "limit": limit, "offset": offset}


class JobRequest(BaseModel):
    """`kind` plus the options of the matching CLI command (`device`, `allow_offline` route it)."""

    model_config = ConfigDict(extra="allow")
    kind: Literal["probe", "infer", "train"]
    device: str = "auto"
    allow_offline: bool = False


@router.post("/jobs", status_code=201, dependencies=[Write])
def submit_job(req: JobRequest, s: Settings = Depends(settings)) -> dict[str, Any]:
    params = dict(req.model_extra or {})
    device = req.device
    if req.kind == "train" and isinstance(params.get("device_list"), list) and params["device_list"]:
        device = params["device_list"][0]
    job_id = submit(s, req.kind, params, device, req.allow_offline)
    return _job_or_404(s, job_id)


@router.get("/jobs/{job_id}")
def job(job_id: int, points: Annotated[int | None, Query(
            ge=2, le=100_000, description="At most this many throughput points per device: "
            "consecutive ones merged (samples and seconds summed). Default: every point.")] = None,
        s: Settings = Depends(settings)) -> dict[str, Any]:
    """One job with its throughput over time (and epochs, for training)."""
    return cast(dict[str, Any], require_job(s.database, job_id, with_metrics=True, points=points))


@router.post("/jobs/{job_id}/cancel", dependencies=[Write])
def cancel(job_id: int, s: Settings = Depends(settings)) -> dict[str, Any]:
    _job_or_404(s, job_id)
    outcome = cancel_job(s, job_id)
    return {"outcome": outcome.value, **_job_or_404(s, job_id)}


@router.get("/jobs/{job_id}/predictions")
def job_predictions(job_id: int, limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
                    offset: Annotated[int, Query(ge=0)] = 0,
                    format: Literal["json", "csv"] = "json",
                    s: Settings = Depends(settings)) -> Any:
    record = require_job(s.database, job_id)
    rows = results.read(s.database, s.home_path, record, limit, offset)
    if format == "json":
        return {"items": rows, "total": results.count(s.database, s.home_path, record),
                "limit": limit, "offset": offset}
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(results.prediction_csv(rows))
    return Response(out.getvalue(), media_type="text/csv")


@router.get("/devices")
def devices(s: Settings = Depends(settings)) -> list[dict[str, Any]]:
    """Every device worker: live state, queue depth, the job holding it, heartbeat age."""
    return device_table(s)


@router.get("/models")
def models(s: Settings = Depends(settings)) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], registry.list_models(s.database))


@router.get("/models/{name}")
def model_versions(name: str, s: Settings = Depends(settings)) -> list[dict[str, Any]]:
    registry.resolve(s.database, name)  # 404 for an unknown name
    return cast(list[dict[str, Any]], registry.list_models(s.database, name))


@router.post("/models/{name}/promote", dependencies=[Write])
def promote(name: str, version: Annotated[int, Body(embed=True, ge=1)],
            s: Settings = Depends(settings)) -> dict[str, Any]:
    return cast(dict[str, Any], registry.promote(s.database, name, version))


class ScheduleRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=128)
    cron: str
    tz: str = "UTC"
    dataset: str
    promote: str = "if-better"
    metric: str = "val_accuracy"
    min_gain: float = 0.0


@router.get("/schedules")
def list_schedules(s: Settings = Depends(settings)) -> list[dict[str, Any]]:
    return schedules.list_schedules(s.database)


@router.post("/schedules", status_code=201, dependencies=[Write])
def create_schedule(req: ScheduleRequest, s: Settings = Depends(settings)) -> dict[str, Any]:
    """The body holds the schedule fields plus the training options (`arch`, `name` of the model
    as `model`, `epochs`, ...)."""
    spec = dict(req.model_extra or {})
    if "model" in spec:
        spec["name"] = spec.pop("model")
    return add_schedule(s, req.name, req.cron, req.tz, req.dataset, spec, req.promote, req.metric,
                        req.min_gain)


@router.get("/schedules/{name}")
def schedule(name: str, s: Settings = Depends(settings)) -> dict[str, Any]:
    record = schedules.get(s.database, name)
    record.pop("id")
    return {**record, "fires": schedules.fires(s.database, name)}


@router.post("/schedules/{name}/pause", dependencies=[Write])
def pause(name: str, s: Settings = Depends(settings)) -> dict[str, Any]:
    schedules.set_enabled(s.database, name, False)
    return schedule(name, s)


@router.post("/schedules/{name}/resume", dependencies=[Write])
def resume_schedule(name: str, s: Settings = Depends(settings)) -> dict[str, Any]:
    resume(s, name)
    return schedule(name, s)


@router.post("/schedules/{name}/run-now", dependencies=[Write])
def fire_now(name: str, s: Settings = Depends(settings)) -> dict[str, Any]:
    run_now(s, name)
    return schedule(name, s)


@router.delete("/schedules/{name}", status_code=204, dependencies=[Write])
def delete_schedule(name: str, s: Settings = Depends(settings)) -> Response:
    schedules.remove(s.database, name)
    return Response(status_code=204)
