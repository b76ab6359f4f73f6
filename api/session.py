"""`/api/v1/session`: the dashboard's login. A user's token is sent once and exchanged for a
session cookie (`mxq_session`: HttpOnly, SameSite=Strict, Secure when served over TLS), so the
page never keeps the token; the answer's `csrf` goes with every write the page makes
(`X-CSRF-Token`, checked by `mxq.api.auth`). Logout ends the session in SQL, not only the cookie.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field

from mxq.api.auth import (
    SESSION_COOKIE,
    Caller,
    caller,
    from_token,
    session_cookie,
    settings,
)
from mxq.api.schemas import JsonBody, Problem
from mxq.db.sharing import sessions
from mxq.workers.settings import Settings

router = APIRouter(prefix="/api/v1")


class Login(JsonBody):
    token: str = Field(min_length=1, max_length=512, description="A user's token (`mxq users "
                       "add`) or MXQ_API_TOKEN: sent once, never stored by the page.")


class SessionAnswer(JsonBody):
    user: str
    role: str
    teams: list[str]
    csrf: str | None = Field(description="What the page's writes send as X-CSRF-Token; null "
                             "when the request did not come by the session cookie.")
    expires_at: str | None


def _problems(*statuses: int) -> dict[int | str, dict[str, object]]:
    return {status: {"model": Problem, "description": "a problem document"}
            for status in sorted({*statuses, 421, 422, 503})}


def _answer(who: Caller, csrf: str | None, expires_at: str | None) -> SessionAnswer:
    return SessionAnswer(user=who.name, role=who.role.value, teams=sorted(who.teams), csrf=csrf,
                         expires_at=expires_at)


@router.post("/session", response_model=SessionAnswer, responses=_problems(401, 403, 413, 415))
def login(req: Login, request: Request, response: Response,
          s: Settings = Depends(settings)) -> SessionAnswer:
    """Log in: the token for a session cookie (the dashboard's; scripts send the token itself)."""
    who = from_token(s, req.token)
    cookie, opened = sessions.open_session(s.database, who.name)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=sessions.SESSION_SECONDS, path="/",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return _answer(who, opened["csrf"], opened["expires_at"])


@router.get("/session", response_model=SessionAnswer, responses=_problems(401, 403))
def whoami(who: Annotated[Caller, Depends(caller)],
           cookie: Annotated[str | None, Depends(session_cookie)],
           s: Settings = Depends(settings)) -> SessionAnswer:
    """Who the request is made as (the page learns its user and csrf again after a reload)."""
    found = sessions.find(s.database, cookie) if cookie and who.csrf else None
    return _answer(who, who.csrf, found["expires_at"] if found else None)


@router.delete("/session", status_code=204, responses=_problems(401, 403, 413, 415))
def logout(who: Annotated[Caller, Depends(caller)],
           cookie: Annotated[str | None, Depends(session_cookie)],
           s: Settings = Depends(settings)) -> Response:
    """Log out: the session ends (its cookie opens nothing any more) and the cookie is cleared."""
    if cookie and who.csrf:
        sessions.close(s.database, cookie)
    answer = Response(status_code=204)
    answer.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return answer
