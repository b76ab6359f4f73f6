"""A frozen PostgreSQL or object store (issue 44, item 4): a stopped server keeps its sockets
open and answers nothing; every wait for it is bounded, and the API answers its documented 503.
The servers are real (the stack's PostgreSQL, the session's moto), frozen by a relay in front of
them that passes nothing on (`tests/support/relay.py`); the bounds are shortened for the test
(the object store's by its setting, MXQ_S3_TIMEOUT_SECONDS)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from mxq.api import guard, routes
from mxq.api.app import app
from mxq.db import engine
from mxq.db.reports.history import JobFilter, list_jobs
from mxq.workers.storage import client as storage
from tests.conftest import Stack
from tests.support.relay import Relay
from tests.support.s3 import BUCKET, S3Server

TOKEN = "frozen-servers-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GIVE_UP = 60  # seconds after which a wait counts as unbounded (each bound here is 1-2 s)

pytestmark = pytest.mark.both_legs


def _ended(call: Callable[[], Any]) -> BaseException | None:
    """What `call` raised (None if it returned), failing the test when it does not end."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as exc:  # what the caller would see
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GIVE_UP)
    assert raised, f"still waiting after {GIVE_UP} s: the wait is not bounded"
    return raised[0]


@pytest.fixture
def api(stack: Stack) -> Iterator[Callable[..., TestClient]]:
    """The API app on the stack with an admin token, and settings changed per test."""

    def client(**changes: Any) -> TestClient:
        s = stack.settings.model_copy(update={"api_token": SecretStr(TOKEN), **changes})
        app.dependency_overrides[routes.settings] = lambda: s
        return TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))

    yield client
    app.dependency_overrides.clear()


@pytest.fixture
def frozen_pg(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Relay, str]]:
    """A relay to the stack's PostgreSQL and the database URL through it; bounds of 1-2 s."""
    if stack.name == "embedded":
        pytest.skip("SQLite is a file in the process: there is no server to freeze")
    monkeypatch.setattr(engine, "ANSWER_SECONDS", 2.0)
    monkeypatch.setattr(guard, "DATABASE_ANSWER_SECONDS", 1.0)
    real = make_url(stack.settings.database)
    relay = Relay((real.host or "127.0.0.1", real.port or 5432))
    url = real.set(port=relay.port).render_as_string(hide_password=False)
    try:
        yield relay, url
    finally:
        engine.get_engine(url).dispose()
        relay.close()


def test_a_frozen_database_fails_a_read_instead_of_hanging(frozen_pg: tuple[Relay, str]) -> None:
    """A statement on an open connection, then a read through the pool (its ping of a kept
    connection, then a new connection), to a server that answers nothing: each ends with the
    database's error, and the first read after the thaw succeeds."""
    relay, url = frozen_pg
    with engine.get_engine(url).connect() as conn:
        conn.execute(text("SELECT 1"))
        with relay.frozen():
            why = _ended(lambda: conn.execute(text("SELECT 1")))
    assert isinstance(why, OperationalError) and "PostgreSQL gave no answer in 2 s" in str(why), why
    assert engine.ping(url) is None  # a kept connection in the pool again
    with relay.frozen():
        assert isinstance(_ended(lambda: list_jobs(url, JobFilter(limit=5))), OperationalError)
    assert engine.ping(url) is None


def test_the_health_check_answers_503_while_the_database_is_frozen(
        frozen_pg: tuple[Relay, str], api: Callable[..., TestClient]) -> None:
    relay, url = frozen_pg
    client = api(database_url=url)
    assert client.get("/api/v1/devices", headers=AUTH).status_code == 200
    with relay.frozen():
        answers: list[Any] = []
        assert _ended(lambda: answers.append(client.get("/api/v1/devices", headers=AUTH))) is None
        assert answers[0].status_code == 503, answers[0].text
        assert answers[0].headers["content-type"] == "application/problem+json"
        listed: list[Any] = []
        assert _ended(lambda: listed.append(client.get("/api/v1/jobs", headers=AUTH))) is None
        assert listed[0].status_code == 503
    assert client.get("/api/v1/devices", headers=AUTH).status_code == 200


@pytest.fixture
def frozen_s3() -> Iterator[tuple[Relay, str]]:
    """A relay to the session's moto server and its endpoint URL."""
    server = urlsplit(S3Server.shared().endpoint)
    relay = Relay((server.hostname or "127.0.0.1", server.port or 80))
    try:
        yield relay, f"http://127.0.0.1:{relay.port}"
    finally:
        relay.close()


def test_the_object_store_bound_is_a_setting(stack: Stack) -> None:
    """MXQ_S3_TIMEOUT_SECONDS bounds each call, retries included: the client a process builds
    carries its share per try, and a changed value builds another client (they are cached)."""
    default = storage.client(stack.settings).meta.config
    assert (default.connect_timeout, default.read_timeout) == (5.0, 15.0)
    assert default.retries["total_max_attempts"] == 3
    short = stack.settings.model_copy(update={"s3_timeout_seconds": 2.0})
    config = storage.client(short).meta.config
    assert (config.connect_timeout, config.read_timeout) == (1.0, 1.0)
    assert config.retries["total_max_attempts"] == 2
    assert storage.bounds(0.5) == (0.5, 0.5, 1) and storage.bounds(3600.0) == (5.0, 1200.0, 3)


def test_a_submit_answers_503_while_the_object_store_is_frozen(
        frozen_s3: tuple[Relay, str], api: Callable[..., TestClient], mlp: dict) -> None:
    """The submit reads the input object's size and ETag (to pin what the job reads): a store
    that answers nothing gives a 503 naming it within MXQ_S3_TIMEOUT_SECONDS (and a second or
    so of backoff), not a request that waits for minutes."""
    relay, endpoint = frozen_s3
    url = S3Server.shared().put("in/frozen/x.npy", b"\x93NUMPY" + b"\0" * 250)
    client = api(s3_endpoint_url=endpoint, s3_timeout_seconds=2.0)
    body = {"kind": "infer", "model": "mlp64", "input": url, "device": "auto"}
    with relay.frozen():
        answers: list[Any] = []
        assert _ended(lambda: answers.append(client.post("/api/v1/jobs", json=body, headers=AUTH))) is None
    assert answers[0].status_code == 503, answers[0].text
    detail = answers[0].json()["detail"]
    assert f"s3://{BUCKET}/in/frozen/x.npy" in detail, detail
    assert "gave no answer in 2 s (2 tries of 1 s, MXQ_S3_TIMEOUT_SECONDS" in detail, detail
