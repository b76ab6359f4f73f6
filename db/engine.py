"""Engines and sessions: one engine per database URL per process."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any, cast

import psycopg
from sqlalchemy import CursorResult, Engine, Result, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from mxq.db.retry import first_line

# Seconds to wait for a database that does not answer before saying so.
CONNECT_TIMEOUT = 5
# Connections a process keeps to PostgreSQL, and opens beyond that for a burst (SQLAlchemy's
# defaults). A worker uses one or two at a time, so each device costs PostgreSQL about two
# connections of its max_connections (docs/scaling.md); set before the first engine is made.
POOL_SIZE, MAX_OVERFLOW = 5, 10
# Seconds SQLite waits on a lock held by another worker process before giving up.
SQLITE_BUSY_SECONDS = 30
# Seconds PostgreSQL lets a session sit idle inside a transaction before it ends the session. No
# transaction of mxq waits on its client for more than milliseconds; a process paused inside one
# (SIGSTOP, a frozen VM) would otherwise hold its row locks for as long as it is paused, and the
# reconciler's requeue of its job, the next attempt's writes and every claim of that row would
# wait behind it. Ended, its transaction rolls back; the process, resumed, meets a closed
# connection, retries on a new one, and its fence refuses the write.
IDLE_IN_TRANSACTION_SECONDS = 20
# Seconds a process waits for PostgreSQL's answer to one request (a statement, a commit, the
# pool's ping, a connection) before it gives the connection up as dead: a frozen server (every
# process stopped, a VM paused) keeps its sockets open, the kernel acknowledges what is sent,
# and nothing else would ever end the wait. Longer than IDLE_IN_TRANSACTION_SECONDS, so a claim
# waiting behind a paused writer's row lock gets the row when the server ends that writer.
ANSWER_SECONDS = 30.0
# The bound of the calls made inside `answers_within`: shorter for the API's requests (a health
# check must say 503 while its caller still waits), None for migrations (a rebuilt table on a
# large database takes minutes); infinity leaves ANSWER_SECONDS.
_answer_bound: ContextVar[float | None] = ContextVar("mxq_db_answer_bound", default=math.inf)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """WAL lets readers and one writer share the file across worker processes; with WAL,
    synchronous=NORMAL syncs at checkpoints instead of every commit (SQLite's advice for WAL:
    a crash of any process loses nothing, a power cut at most the last commits)."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_SECONDS * 1000}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def answer_bound() -> float | None:
    """Seconds the current call may wait for PostgreSQL's answer (None: as long as it takes)."""
    bound = _answer_bound.get()
    return None if bound is None else min(ANSWER_SECONDS, bound)


@contextmanager
def answers_within(seconds: float | None) -> Iterator[None]:
    """Inside the block, a wait for PostgreSQL is bounded by `seconds` (None: not bounded)."""
    token = _answer_bound.set(seconds)
    try:
        yield
    finally:
        _answer_bound.reset(token)


class _AnsweringConnection(psycopg.Connection[Any]):
    """psycopg's connection with every wait for the server bounded (`answer_bound`). Past it the
    connection is closed, so SQLAlchemy takes it for a disconnect and drops it from the pool, and
    the caller gets an OperationalError (a 503 from the API, a retry in a worker)."""

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        bound = answer_bound()
        if bound is not None and (timeout is None or timeout > bound):
            timeout = bound
        try:
            return super().wait(gen, interval, timeout)
        except psycopg.errors._WaitTimeout:
            self.pgconn.finish()
            raise psycopg.OperationalError(f"PostgreSQL gave no answer in {timeout:g} s "
                                           "(is its server frozen or overloaded?)") from None


def _bounded_connect(_dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
    """Connections of the bounded kind, whose connect waits at most the current bound too."""
    bound = answer_bound()
    if bound is not None:
        cparams["connect_timeout"] = max(1, min(int(cparams.get("connect_timeout", bound)), int(bound)))
    return _AnsweringConnection.connect(*cargs, **cparams)


def _postgres_session(dbapi_conn: Any, _record: Any) -> None:
    """Bound a transaction whose client went quiet (IDLE_IN_TRANSACTION_SECONDS). Set on each new
    connection rather than as a startup option, which PgBouncer refuses."""
    with dbapi_conn.cursor() as cur:
        cur.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_SECONDS * 1000}")
    dbapi_conn.commit()


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain `postgresql://` URLs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def safe_url(url: str) -> str:
    """The URL with its password hidden, fit for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_SECONDS})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW,
                           pool_timeout=ANSWER_SECONDS, connect_args={"connect_timeout": CONNECT_TIMEOUT})
    if engine.dialect.driver == "psycopg":
        event.listen(engine, "do_connect", _bounded_connect)
    if engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _postgres_session)
    return engine


def ping(url: str) -> str | None:
    """None when the database answers a read, else why not (the driver's first line)."""
    try:
        with get_engine(url).connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        return first_line(exc)
    return None


@lru_cache(maxsize=8)
def _sessions(engine: Engine) -> sessionmaker[Session]:
    """One session factory per engine: making one per session made SQLAlchemy set up its event
    classes anew each time, two thirds of the CPU of a heartbeat."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = _sessions(get_engine(url))()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE matched (SQLAlchemy types `execute` as a plain Result)."""
    return cast("CursorResult[Any]", result).rowcount
