"""The FastAPI app: `/api/v1`, the dashboard at `/`, Prometheus metrics at `/metrics`.

Errors are JSON `{"detail": "..."}` with the status that fits: 404 unknown, 409 exists,
422 bad input (a rejected job also names its failed job id), 401 no token, 503 a server down.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from sqlalchemy.exc import OperationalError

from api.metrics import render_metrics
from api.routes import router, settings
from db.registry import ModelNotFound
from db.schedules import ScheduleError, ScheduleExists
from workers.cancel import CancelError
from workers.cron import CronError
from workers.jobspecs import ParamsError
from workers.paths import PathError
from workers.queues import DeviceSpecError
from workers.routing import RoutingError
from workers.settings import Settings
from workers.submit import JobRejected, SubmitError

DASHBOARD = Path(__file__).parent / "static" / "index.html"
STATUS = [(JobRejected, 422), (ModelNotFound, 404), (ScheduleError, 404), (CancelError, 404),
          (ScheduleExists, 409), (RoutingError, 422), (DeviceSpecError, 422), (ParamsError, 422),
          (PathError, 422), (CronError, 422), (SubmitError, 503), (OperationalError, 503)]


def _handler(status: int):  # noqa: ANN202
    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        body = {"detail": str(exc) if not isinstance(exc, OperationalError)
                else "database unavailable: " + str(exc.orig or exc).splitlines()[0]}
        if isinstance(exc, JobRejected):
            body["job_id"] = exc.job_id
        return JSONResponse(body, status_code=status)
    return handle


def create_app() -> FastAPI:
    app = FastAPI(title="mxq", version="0.1.0",
                  description="Batch deep-learning jobs on pinned GPU/CPU workers: submit, "
                              "query the history, cancel.")
    app.include_router(router)
    for exc_type, status in STATUS:
        app.add_exception_handler(exc_type, _handler(status))

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD, media_type="text/html")

    @app.get("/metrics", include_in_schema=False)
    def metrics(s: Settings = Depends(settings)) -> Response:
        body, content_type = render_metrics(s)
        return Response(body, media_type=content_type)

    return app


app = create_app()
