"""Users and roles (issue 32) through the real API and CLI, against live workers: a `read` user
refused a submit (403), a `submit` user refused another's cancel, the admin of MXQ_API_TOKEN
allowed it, owners recorded and filtered, tokens replaced and removed, and no token in clear
in SQL."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select

from mxq import tokens
from mxq.api import routes
from mxq.api.app import app
from mxq.db.engine import session_scope
from mxq.db.schema import User
from mxq.db.sharing import users
from mxq.users import local_owner
from tests.conftest import Stack

ADMIN_TOKEN = "users-admin-token-0123"
PROBE = {"kind": "probe", "device": "cpu:0", "size": 16}


# The users' names in this test: a removed user's name is retired (its jobs stay its own), so
# each test of the shared stack adds users of names no earlier test used.
N: dict[str, str] = {}
_runs = itertools.count(1)


@pytest.fixture
def team(workers: Stack) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """An API with MXQ_API_TOKEN and three users: alice and carol submit, bob reads. Removed
    after: the stack is shared with other tests, which write without a user token."""
    s = workers.settings.model_copy(update={"api_token": SecretStr(ADMIN_TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: s
    made: dict[str, str] = {}
    run = next(_runs)
    N.update({who: f"{who}{run}" for who in ("alice", "bob", "carol")})
    try:
        for name, role in ((N["alice"], "submit"), (N["bob"], "read"), (N["carol"], "submit")):
            added = workers.mxq_json("users", "add", name, "--role", role)
            assert added["name"] == name and added["role"] == role
            made[name] = added["token"]
        yield TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)), made
    finally:
        app.dependency_overrides.clear()
        for name in N.values():
            if any(u["name"] == name for u in users.list_users(workers.settings.database)):
                users.remove(workers.settings.database, name)


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_roles_decide_who_submits_and_who_cancels_what(team: tuple[TestClient, dict[str, str]],
                                                       workers: Stack) -> None:
    client, token = team
    refused = client.post("/api/v1/jobs", json=PROBE, headers=_as(token[N["bob"]]))
    assert refused.status_code == 403 and "role read" in refused.json()["detail"]
    assert client.post("/api/v1/jobs", json=PROBE).status_code == 401  # users exist: a token is needed
    assert client.post("/api/v1/jobs", json=PROBE, headers=_as(token[N["bob"]] + "x")).status_code == 401

    job = client.post("/api/v1/jobs", json=PROBE, headers=_as(token[N["alice"]]))
    assert job.status_code == 201 and job.json()["owner"] == N["alice"]
    job_id = job.json()["id"]
    other = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=_as(token[N["carol"]]))
    assert other.status_code == 403 and N["alice"] in other.json()["detail"]
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=_as(token[N["alice"]])).status_code == 200
    by_admin = client.post("/api/v1/jobs", json=PROBE, headers=_as(ADMIN_TOKEN)).json()
    assert by_admin["owner"] == "admin"
    assert client.post(f"/api/v1/jobs/{by_admin['id']}/cancel",
                       headers=_as(token[N["alice"]])).status_code == 403
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=_as(ADMIN_TOKEN)).status_code == 200

    listed = client.get("/api/v1/jobs", params={"user": N["alice"], "limit": 1000},
                        headers=_as(token[N["bob"]])).json()["items"]
    assert [j["id"] for j in listed] == [job_id]
    assert [j["id"] for j in workers.mxq_json("jobs", "--user", N["alice"])] == [job_id]
    local = workers.mxq_json("probe", "--device", "cpu:1", "--size", "16")
    assert workers.job(local["id"])["owner"] == local_owner()  # the CLI acts as the local admin
    queued = client.post("/api/v1/jobs", json={**PROBE, "device": "cpu:7", "allow_offline": True,
                                               "priority": "low"},
                         headers=_as(token[N["carol"]]))  # no worker: it waits, counted as carol's
    assert queued.status_code == 201, queued.text
    assert (queued.json()["priority"], queued.json()["preemptible"]) == ("low", True)
    scraped = client.get("/metrics", headers=_as(ADMIN_TOKEN)).text
    assert f'mxq_user_jobs{{owner="{N["carol"]}",status="queued"}} 1.0' in scraped
    assert all(f'mxq_queued_jobs{{priority="{level}"}}' in scraped for level in ("high", "normal", "low"))
    assert 'mxq_queued_jobs{priority="low"} 0.0' not in scraped  # carol's waits
    assert client.post(f"/api/v1/jobs/{queued.json()['id']}/cancel",
                       headers=_as(token[N["carol"]])).status_code == 200


def test_tokens_are_replaced_removed_and_never_stored_in_clear(
        team: tuple[TestClient, dict[str, str]], workers: Stack) -> None:
    client, token = team
    with session_scope(workers.settings.database) as s:
        stored = {u.name: (u.token_id, u.token_hash) for u in s.scalars(select(User))}
    for name, clear in token.items():
        parsed = tokens.parse(clear)
        token_id, token_hash = stored[name]
        assert parsed is not None and token_id == parsed[0]
        assert token_hash is not None and parsed[1] not in token_hash
        assert token_hash.startswith("scrypt$") and tokens.verify(parsed[1], token_hash)
    assert stored["admin"] == (None, None)  # MXQ_API_TOKEN's user: nothing of it stored
    assert not any(t in str(workers.mxq("users", "ls").stdout) for t in token.values())

    assert client.post("/api/v1/jobs", json=PROBE, headers=_as(token[N["alice"]])).status_code == 201
    again = workers.mxq_json("users", "set", N["alice"], "--new-token")["token"]
    assert client.post("/api/v1/jobs", json=PROBE, headers=_as(token[N["alice"]])).status_code == 401
    assert client.post("/api/v1/jobs", json=PROBE, headers=_as(again)).status_code == 201
    assert workers.mxq("users", "set", N["bob"], "--role", "submit").returncode == 0
    assert client.post("/api/v1/jobs", json=PROBE, headers=_as(token[N["bob"]])).status_code == 201
    assert workers.mxq("users", "rm", N["carol"]).returncode == 0
    assert client.post("/api/v1/jobs", json=PROBE, headers=_as(token[N["carol"]])).status_code == 401
    taken = workers.mxq("users", "add", N["alice"])
    assert taken.returncode == 2 and "exists already" in taken.stderr
    retired = workers.mxq("users", "add", N["carol"])  # removed: its name is never given again
    assert retired.returncode == 2 and "was removed" in retired.stderr
    bad = workers.mxq("users", "add", "Alice Smith")
    assert bad.returncode == 2 and "user name" in bad.stderr
