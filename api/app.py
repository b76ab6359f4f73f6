"""The FastAPI app: `/api/v1`, the dashboard at `/`, Prometheus metrics at `/metrics`.

Errors are JSON `{"detail": "..."}` with the status that fits: 404 unknown, 409 exists,
413 body too large, 422 bad input (a rejected job also names its failed job id), 401 no token,
503 a server down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from sqlalchemy.exc import OperationalError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mxq.api.metrics import render_metrics
from mxq.api.routes import router, settings
from mxq.errors import Conflict, MxqError, NotFound, Unavailable, UserError
from mxq.workers.settings import Settings

DASHBOARD = Path(__file__).parent / "static" / "index.html"
# The one place an expected failure becomes an HTTP status (mxq.errors); the first match wins.
STATUS: list[tuple[type[Exception], int]] = [(UserError, 422), (NotFound, 404), (Conflict, 409),
                                             (Unavailable, 503), (OperationalError, 503)]


def status_of(exc: Exception) -> int:
    return next((status for kind, status in STATUS if isinstance(exc, kind)), 500)


async def _expected(_request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, OperationalError):
        body: dict[str, Any] = {"detail": "database unavailable: " + str(exc.orig or exc).splitlines()[0]}
    else:
        body = {"detail": str(exc), **(exc.details() if isinstance(exc, MxqError) else {})}
    return JSONResponse(body, status_code=status_of(exc))


def _too_large(limit: int, length: int | None = None) -> str:
    size = f"request body of {length} bytes" if length is not None else "request body"
    return f"{size} exceeds the limit of {limit} bytes (MXQ_MAX_BODY_BYTES)"


class BodyLimit:
    """413 for a request body over MXQ_MAX_BODY_BYTES: at once when Content-Length says so, else
    as soon as the streamed (chunked) body passes the limit, so no body is ever buffered whole."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        overrides = scope["app"].dependency_overrides  # honour a test's settings override
        limit = overrides.get(settings, settings)().max_body_bytes
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await JSONResponse({"detail": _too_large(limit, int(length))}, status_code=413)(
                scope, receive, send)
            return
        received = 0

        async def capped() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # FastAPI re-raises an HTTPException from the body read
                    raise HTTPException(413, _too_large(limit))
            return message

        await self.app(scope, capped, send)


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(map(str, loc[1:] if loc and loc[0] in ("body", "query", "path") else loc))


async def _invalid(_request: Request, exc: Exception) -> JSONResponse:
    """Request validation errors in the API's one-line style: `field=value: what is allowed`."""
    assert isinstance(exc, RequestValidationError)
    problems = []
    for e in exc.errors():
        if e["type"] == "json_invalid":
            problems.append(f"malformed JSON body at character {e['loc'][-1]}: "
                            f"{e.get('ctx', {}).get('error', e['msg'])}")
        else:
            problems.append(f"{_where(e['loc']) or 'body'}={e.get('input')!r}: {e['msg']}")
    return JSONResponse({"detail": "invalid request: " + "; ".join(problems)}, status_code=422)


def create_app() -> FastAPI:
    app = FastAPI(title="mxq", version="0.1.0",
                  description="Batch deep-learning jobs on pinned GPU/CPU workers: submit, "
                              "query the history, cancel.")
    app.include_router(router)
    app.add_exception_handler(MxqError, _expected)
    app.add_exception_handler(OperationalError, _expected)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_middleware(BodyLimit)

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD, media_type="text/html")

    @app.get("/metrics", include_in_schema=False)
    def metrics(s: Settings = Depends(settings)) -> Response:
        body, content_type = render_metrics(s)
        return Response(body, media_type=content_type)

    return app


app = create_app()
