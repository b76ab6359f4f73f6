"""The versions panel's read filter (issue 57): `GET /api/v1/lineage/versions` counts only the
inference jobs the caller may read (its own, its teams', every job for an admin). Removing that
filter (`versions_scored`'s `owner == name or team in teams` in mxq.db.lineage.lineage) passed
every test, since the stack tests read the panel as an admin or as a job's only owner. This one
is fast: a migrated SQLite database (`store`), no broker and no workers; the jobs are written
queued through mxq.db.jobs, which is all the `prediction_lineage` view needs of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from mxq.api import routes
from mxq.api.app import app
from mxq.db.jobs import create_jobs
from mxq.db.lineage import lineage
from mxq.db.sharing import teams, users
from mxq.users import Role
from mxq.workers.settings import Settings

ADMIN_TOKEN = "lineage-versions-admin-token-0123"
ML = "ml"
ALICE_MODEL = "alice-net"
BOB_MODEL = "bob-net"


@dataclass
class Readers:
    """The API app on `store`'s database, with alice (submit) and carol (read) in team `ml`,
    bob (submit) in none, and the MXQ_API_TOKEN admin."""

    client: TestClient
    url: str
    tokens: dict[str, str]

    def auth(self, who: str) -> dict[str, str]:
        token = ADMIN_TOKEN if who == "admin" else self.tokens[who]
        return {"Authorization": f"Bearer {token}"}

    def versions(self, who: str) -> list[dict]:
        answer = self.client.get("/api/v1/lineage/versions", headers=self.auth(who))
        assert answer.status_code == 200, (who, answer.text)
        return answer.json()


def _infer(url: str, owner: str, team: str | None, model: str, version: int,
           inputs: list[str]) -> list[int]:
    """Queued inference jobs of `owner` (shared with `team`) scoring `inputs` with the version."""
    params = [{"model": model, "model_version": version, "input": name} for name in inputs]
    return create_jobs(url, "infer", params, "cpu", "default", owner=owner, team=team)


@pytest.fixture
def readers(store: Settings) -> Iterator[Readers]:
    url = store.database
    made = {who: users.add(url, who, role)
            for who, role in (("alice", Role.SUBMIT), ("bob", Role.SUBMIT), ("carol", Role.READ))}
    teams.add_team(url, ML)
    for who in ("alice", "carol"):
        teams.set_member(url, ML, who)
    _infer(url, "alice", ML, ALICE_MODEL, 2, ["a.npy", "b.npy", "a.npy"])  # shared with ml
    _infer(url, "alice", None, ALICE_MODEL, 3, ["c.npy"])  # alice's alone
    _infer(url, "bob", None, BOB_MODEL, 1, ["d.npy"])
    s = store.model_copy(update={"api_token": SecretStr(ADMIN_TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: s
    try:
        yield Readers(TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)),
                      url, made)
    finally:
        app.dependency_overrides.clear()


def _row(model: str, version: int, sets: int, inputs: int) -> dict:
    return {"model": model, "version": version, "prediction_sets": sets, "inputs": inputs,
            "succeeded": 0}


ALICE_V2 = _row(ALICE_MODEL, 2, 3, 2)
ALICE_V3 = _row(ALICE_MODEL, 3, 1, 1)
BOB_V1 = _row(BOB_MODEL, 1, 1, 1)


def test_each_reader_sees_the_versions_of_the_jobs_it_may_read(readers: Readers) -> None:
    """Alice: both her versions; carol (her team): the version alice shared with `ml`, not the
    one she kept; bob (no team): only his own; the admin: every version."""
    assert readers.versions("alice") == [ALICE_V2, ALICE_V3]
    assert readers.versions("carol") == [ALICE_V2]
    assert readers.versions("bob") == [BOB_V1]
    assert readers.versions("admin") == [ALICE_V2, ALICE_V3, BOB_V1]


def test_the_db_function_filters_by_name_and_teams(readers: Readers) -> None:
    """`versions_scored` itself, as the API calls it: a reader's name and teams, or None."""
    url = readers.url
    assert lineage.versions_scored(url, ("alice", teams.teams_of(url, "alice"))) == [ALICE_V2, ALICE_V3]
    assert lineage.versions_scored(url, ("carol", frozenset({ML}))) == [ALICE_V2]
    assert lineage.versions_scored(url, ("bob", frozenset())) == [BOB_V1]
    assert lineage.versions_scored(url, ("dan", frozenset())) == []
    assert lineage.versions_scored(url, None) == [ALICE_V2, ALICE_V3, BOB_V1]


def test_the_lineage_list_filters_before_it_pages(readers: Readers) -> None:
    """Issue 58: the LIMIT was applied before the read filter, so bob, with 12 readable sets
    behind 30 of alice's, got none for limit=10. Now he gets his first 10, a Link to the next
    page, and the last 2 there with no Link; no page ever holds another user's row."""
    _infer(readers.url, "alice", None, ALICE_MODEL, 3, [f"x{i}.npy" for i in range(30)])
    bob = _infer(readers.url, "bob", None, BOB_MODEL, 1, [f"y{i}.npy" for i in range(11)])
    first = readers.client.get("/api/v1/lineage", params={"limit": 10}, headers=readers.auth("bob"))
    assert first.status_code == 200, first.text
    assert [r["owner"] for r in first.json()] == ["bob"] * 10
    link = first.headers["link"]
    assert link.endswith('>; rel="next"') and f"after={first.json()[-1]['job_id']}" in link
    rest = readers.client.get(link[1:link.index(">")], headers=readers.auth("bob"))
    assert [r["job_id"] for r in first.json() + rest.json()][-11:] == bob
    assert len(first.json() + rest.json()) == 12 and "link" not in rest.headers
    mine = readers.client.get("/api/v1/lineage", params={"model": ALICE_MODEL, "version": 3},
                              headers=readers.auth("alice")).json()
    assert len(mine) == 31 and {r["owner"] for r in mine} == {"alice"}
    assert readers.client.get("/api/v1/lineage", params={"model": ALICE_MODEL, "version": 3},
                              headers=readers.auth("bob")).json() == []
