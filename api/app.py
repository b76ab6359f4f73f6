"""The FastAPI app: `/api/v1`, the dashboard at `/`, Prometheus metrics at `/metrics`.

Every error is an RFC 9457 problem document (`application/problem+json`: `type`, `title`,
`status`, `detail`, and `job_id` for a request recorded as a failed job) with the status that
fits: 401 no credential (every route but the static page and the login needs one once any
token exists), 403 a role or an owner that does not allow it, 404 unknown, 405 method (with
`Allow`), 409 exists, 413 body too large, 422 bad input, 503 a server down. The OpenAPI
description declares each route's.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic_core import ErrorDetails
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mxq.api.auth import scraper, settings
from mxq.api.guard import RequestGuard
from mxq.api.lineage import router as lineage_router
from mxq.api.metrics import render_metrics
from mxq.api.routes import router
from mxq.api.session import router as session_router
from mxq.api.webhooks import router as hooks_router
from mxq.db.errors import DATABASE_UNAVAILABLE, unavailable
from mxq.errors import (
    Conflict,
    Forbidden,
    MxqError,
    NotFound,
    Unauthorized,
    Unavailable,
    UserError,
    first_line,
)
from mxq.json_types import JsonObject, JsonValue
from mxq.names import shown
from mxq.workers.settings import Settings

DASHBOARD = Path(__file__).parent / "static" / "index.html"
# The one place an expected failure becomes an HTTP status (mxq.errors); the first match wins.
STATUS: list[tuple[type[Exception], int]] = [(UserError, 422), (NotFound, 404), (Conflict, 409),
                                             (Unavailable, 503), (Forbidden, 403), (Unauthorized, 401),
                                             *((kind, 503) for kind in DATABASE_UNAVAILABLE)]


def status_of(exc: Exception) -> int:
    return next((status for kind, status in STATUS if isinstance(exc, kind)), 500)


PROBLEM = "application/problem+json"
# What FastAPI says when its JSON parser raised something other than a JSON syntax error: bytes
# that are not UTF-8, nesting past the parser's recursion limit, an integer past Python's digit
# limit. The exception it chains (`__cause__`) says which.
UNPARSED_BODY = "There was an error parsing the body"
# Python's JSON parser recurses once per level and gives up near the interpreter's recursion
# limit (1000) less the frames of the server beneath it, so any body it cannot parse is deeper
# than this; mxq's own request bodies nest three levels at most.
MAX_JSON_DEPTH = 500


def problem(status: int, detail: str, headers: dict[str, str] | None = None,
            **extra: JsonValue) -> JSONResponse:
    """The one error shape (RFC 9457); `extra` adds members such as a rejected job's `job_id`."""
    body = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status,
            "detail": detail, **extra}
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM)


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    """A bug: still a problem document (its type only: the traceback goes to the server's log,
    never to the client)."""
    return problem(500, f"internal error ({type(exc).__name__}); the API's log has the details")


async def _expected(_request: Request, exc: Exception) -> JSONResponse:
    if (why := unavailable(exc)) is not None:
        return problem(503, why)
    return problem(status_of(exc), str(exc), **(exc.details() if isinstance(exc, MxqError) else {}))


def _allowed(request: Request) -> str | None:
    """Every method the OpenAPI description gives the request's path (Starlette's own 405 names
    only the first route it matched), with HEAD beside GET; None for a path it does not list."""
    path = request.url.path
    for template, operations in request.app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            methods = {m.upper() for m in operations} | ({"HEAD"} if "get" in operations else set())
            return ", ".join(sorted(methods))
    return None


async def _http(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's and FastAPI's own errors (401, 404 no such route, 405, 413) as problems; a body
    FastAPI could not decode is bad input like any other malformed JSON."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == UNPARSED_BODY:
        return problem(422, "malformed JSON body: " + unparsed_why(exc.__cause__))
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed(request) or headers.get("Allow", "")
    return problem(exc.status_code, str(exc.detail), headers)


def unparsed_why(cause: BaseException | None) -> str:
    """Why the JSON parser refused a body, from the exception FastAPI chained: the real cause, not
    one guess for all of them."""
    if isinstance(cause, UnicodeDecodeError):
        return "it is not UTF-8 text"
    if isinstance(cause, RecursionError):
        return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return (f"a number of more than {sys.get_int_max_str_digits()} digits "
                "(the most an integer may have)")
    return first_line(cause, 200) if cause is not None and str(cause) else "it cannot be read"


def _too_large(limit: int, length: int | None = None) -> str:
    size = f"request body of {length} bytes" if length is not None else "request body"
    return f"{size} exceeds the limit of {limit} bytes (MXQ_MAX_BODY_BYTES)"


def scope_settings(scope: Scope) -> Settings:
    """The settings the routes see (a test's override included), for the middlewares."""
    provide: Callable[[], Settings] = scope["app"].dependency_overrides.get(settings, settings)
    return provide()


class BodyLimit:
    """413 for a request body over MXQ_MAX_BODY_BYTES: at once when Content-Length says so, else
    as soon as the streamed (chunked) body passes the limit, so no body is ever buffered whole."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = scope_settings(scope).max_body_bytes
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await problem(413, _too_large(limit, int(length)))(scope, receive, send)
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


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(map(str, loc[1:] if loc and loc[0] in ("body", "query", "path") else loc))


def _problem_of(e: ErrorDetails) -> str:
    """One validation error as `field=value: what is allowed`; where pydantic's input is the
    whole body (a missing field, a check across fields) the body is not repeated."""
    if e["type"] == "json_invalid":
        return (f"malformed JSON body at character {e['loc'][-1]}: "
                f"{e.get('ctx', {}).get('error', e['msg'])}")
    if e["type"] == "missing":
        return f"{_where(e['loc'])}: Field required"
    if isinstance(e.get("input"), dict) and len(e["loc"]) <= 2:  # body or body.<kind>: its
        return str(e["msg"]).removeprefix("Value error, ")  # message names fields and values
    return f"{_where(e['loc']) or 'body'}={shown(e.get('input'))}: {e['msg']}"


async def _invalid(_request: Request, exc: Exception) -> JSONResponse:
    """Request validation errors in the API's one-line style: `field=value: what is allowed`."""
    assert isinstance(exc, RequestValidationError)
    return problem(422, "invalid request: " + "; ".join(map(_problem_of, exc.errors())))


def _problem_media_types(schema: JsonObject) -> JsonObject:
    """Declare every error answer as `application/problem+json`, as the handlers send it."""
    for _, path in _members(schema.get("paths")):
        for _, operation in _members(path):
            for status, answer in _members(operation.get("responses")):
                content = answer.get("content")
                if isinstance(content, dict) and status[0] in "45" and "application/json" in content:
                    content[PROBLEM] = content.pop("application/json")
    return schema


def _members(value: JsonValue | None) -> list[tuple[str, JsonObject]]:
    """The members of a JSON object (none of anything else) whose values are objects."""
    if not isinstance(value, dict):
        return []
    return [(key, member) for key, member in value.items() if isinstance(member, dict)]


def create_app() -> FastAPI:
    app = FastAPI(title="mxq", version="0.1.0",
                  description="Batch deep-learning jobs on pinned GPU/CPU workers: submit, "
                              "query the history, cancel.")
    app.include_router(router)
    app.include_router(hooks_router)
    app.include_router(lineage_router)
    app.include_router(session_router)
    app.add_exception_handler(MxqError, _expected)
    for kind in DATABASE_UNAVAILABLE:
        app.add_exception_handler(kind, _expected)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
    app.add_middleware(BodyLimit)
    app.add_middleware(RequestGuard, settings=scope_settings, answer=problem)  # runs first

    def openapi() -> JsonObject:
        if app.openapi_schema is None:
            app.openapi_schema = _problem_media_types(get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD, media_type="text/html")

    @app.get("/metrics", include_in_schema=False)
    def metrics(whole: bool = Depends(scraper), s: Settings = Depends(settings)) -> Response:
        body, content_type = render_metrics(s, with_sql=whole)
        return Response(body, media_type=content_type)

    return app


app = create_app()
