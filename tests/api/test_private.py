"""Private by default (issue 43), through the real API app on a live stack: every read needs a
credential once any user has a token, a job's results are its owner's, its team's and the
admins', a model's versions are registered and promoted by its owner and team only, idempotency
keys are per owner, the dashboard's session needs its CSRF token for writes, /metrics has a
scrape token, and the token-less mode answers loopback clients only."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from mxq import tokens
from mxq.api import routes
from mxq.api.app import app
from mxq.db import schedules
from mxq.db.engine import session_scope
from mxq.db.schema import Fire, utcnow
from mxq.db.sharing import teams, users
from mxq.users import Role
from tests.conftest import FINAL, Stack, wait_until

ADMIN_TOKEN = "private-admin-token-0123"
METRICS_TOKEN = "private-metrics-token-0123"
LOOPBACK = ("127.0.0.1", 50000)
_runs = itertools.count(1)


@dataclass
class Team:
    """The API app with MXQ_API_TOKEN and MXQ_METRICS_TOKEN set, and four users of this run:
    alice (submit) and carol (read) in team `ml`, bob (submit) and dan (submit) in none."""

    client: TestClient
    names: dict[str, str]
    tokens: dict[str, str]
    team: str

    def auth(self, who: str) -> dict[str, str]:
        token = ADMIN_TOKEN if who == "admin" else self.tokens[who]
        return {"Authorization": f"Bearer {token}"}


def _client(peer: tuple[str, int] = LOOPBACK) -> TestClient:
    return TestClient(app, base_url="http://127.0.0.1", client=peer)


@pytest.fixture
def team(workers: Stack) -> Iterator[Team]:
    s = workers.settings.model_copy(update={"api_token": SecretStr(ADMIN_TOKEN),
                                            "metrics_token": SecretStr(METRICS_TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: s
    run = next(_runs)
    names = {who: f"{who}-p{run}" for who in ("alice", "bob", "carol", "dan")}
    roles = {"alice": Role.SUBMIT, "bob": Role.SUBMIT, "carol": Role.READ, "dan": Role.SUBMIT}
    url = workers.settings.database
    made = {who: users.add(url, names[who], roles[who]) for who in names}
    ml = f"ml-p{run}"
    teams.add_team(url, ml)
    for who in ("alice", "carol"):
        teams.set_member(url, ml, names[who])
    try:
        yield Team(_client(), names, made, ml)
    finally:
        app.dependency_overrides.clear()
        for name in names.values():
            users.remove(url, name)  # the stack's other tests write without a user token
        teams.remove_team(url, ml)


def _filled(path: str) -> str:
    """An OpenAPI path template with every parameter given a plausible value."""
    return re.sub(r"\{[^}]+\}", lambda m: "1" if "id" in m.group(0) else "x", path)


def test_an_anonymous_request_reads_nothing(team: Team) -> None:
    """Every GET route of the OpenAPI document, /metrics and the session: 401 without a
    credential, and each route answers a user's token (not 401)."""
    anonymous = _client()
    paths = [p for p, ops in app.openapi()["paths"].items() if "get" in ops]
    assert "/api/v1/jobs/{job_id}/predictions" in paths and len(paths) >= 9
    for path in [*map(_filled, paths), "/metrics"]:
        refused = anonymous.get(path)
        assert refused.status_code == 401, (path, refused.text)
        assert refused.headers["www-authenticate"] == "Bearer"
        assert team.client.get(path, headers=team.auth("admin")).status_code != 401, path


def test_forged_tokens_are_refused(team: Team) -> None:
    """A real user's token id with a wrong secret, and a real secret under another user's id."""
    dan, alice = (tokens.parse(team.tokens[w]) for w in ("dan", "alice"))
    assert dan is not None and alice is not None
    wrong_secret = f"mxq_{dan[0]}_{alice[1]}"
    other_id = f"mxq_{alice[0]}_{dan[1]}"
    real = team.tokens["dan"]
    last_changed = real[:-1] + ("B" if real.endswith("A") else "A")  # never the token itself
    for forged in (wrong_secret, other_id, last_changed, ADMIN_TOKEN + "x"):
        answer = team.client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {forged}"})
        assert answer.status_code == 401, forged
    assert team.client.get("/api/v1/jobs", headers=team.auth("dan")).status_code == 200


def test_the_tokenless_mode_answers_loopback_clients_only(workers: Stack) -> None:
    """No token of any kind: a loopback peer is the local admin, any other address 401 (checked
    inside the app, whatever server runs it)."""
    s = workers.settings.model_copy(update={"api_token": None})
    app.dependency_overrides[routes.settings] = lambda: s
    try:
        assert users.with_tokens(s.database) == 0
        for peer in ("127.0.0.1", "127.8.9.10", "::1"):
            assert _client((peer, 1234)).get("/api/v1/jobs").status_code == 200, peer
        for peer in ("203.0.113.7", "10.0.0.2", "::ffff:198.51.100.1", "testclient"):
            refused = _client((peer, 1234)).get("/api/v1/jobs")
            assert refused.status_code == 401 and "loopback" in refused.json()["detail"], peer
            assert _client((peer, 1234)).get("/metrics").status_code == 401, peer
    finally:
        app.dependency_overrides.clear()


def test_predictions_are_read_by_their_owner_team_and_admins(team: Team, workers: Stack,
                                                              mlp: dict) -> None:
    np.save(workers.home / "data" / "private.npy", np.ones((40, 64), np.float32))
    submitted = team.client.post("/api/v1/jobs", headers=team.auth("alice"), json={
        "kind": "infer", "model": "mlp64", "input": "private.npy", "team": team.team})
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    assert (submitted.json()["owner"], submitted.json()["team"]) == (team.names["alice"], team.team)
    done = wait_until(lambda: team.client.get(f"/api/v1/jobs/{job_id}", headers=team.auth("alice")).json(),
                      120, f"job {job_id} to finish", until=lambda j: j["status"] in FINAL)
    assert done["status"] == "succeeded" and done["result"] is not None
    predictions = f"/api/v1/jobs/{job_id}/predictions"
    for reader in ("alice", "carol", "admin"):
        page = team.client.get(predictions, headers=team.auth(reader))
        assert page.status_code == 200 and page.json()["total"] == 40, reader
    refused = team.client.get(predictions, headers=team.auth("bob"))
    assert refused.status_code == 403 and team.names["alice"] in refused.json()["detail"]
    csv = team.client.get(predictions, params={"format": "csv"}, headers=team.auth("bob"))
    assert csv.status_code == 403
    row = team.client.get(f"/api/v1/jobs/{job_id}", headers=team.auth("bob")).json()
    assert row["status"] == "succeeded" and row["result"] is None and row["output"] is None
    listed = team.client.get("/api/v1/jobs", params={"limit": 1000}, headers=team.auth("bob")).json()
    assert [j["result"] for j in listed["items"] if j["id"] == job_id] == [None]
    mine = team.client.get("/api/v1/jobs", params={"limit": 1000}, headers=team.auth("carol")).json()
    assert [j["result"] is not None for j in mine["items"] if j["id"] == job_id] == [True]


def test_sharing_needs_a_team_of_ones_own(team: Team) -> None:
    probe = {"kind": "probe", "device": "cpu:7", "allow_offline": True, "size": 16}
    not_member = team.client.post("/api/v1/jobs", json={**probe, "team": team.team},
                                  headers=team.auth("bob"))
    assert not_member.status_code == 403 and team.team in not_member.json()["detail"]
    unknown = team.client.post("/api/v1/jobs", json={**probe, "team": "no-such-team"},
                               headers=team.auth("alice"))
    assert unknown.status_code == 422 and "no-such-team" in unknown.json()["detail"]


def test_models_are_registered_and_promoted_by_their_owner_and_team(team: Team,
                                                                    workers: Stack) -> None:
    name = f"owned-{team.names['alice']}"
    added = workers.mxq("models", "add", name, "--arch", "mlp", "--input-shape", "64",
                        "--classes", "10")
    assert added.returncode == 0, added.stderr
    alice, bob = team.auth("alice"), team.auth("bob")
    promote = f"/api/v1/models/{name}/promote"
    assert team.client.post(promote, json={"version": 1}, headers=alice).status_code == 403  # admins'
    shared = workers.mxq("models", "share", name, "--owner", team.names["alice"], "--team", team.team)
    assert shared.returncode == 0, shared.stderr
    assert team.client.post(promote, json={"version": 1}, headers=alice).status_code == 200
    assert team.client.post(promote, json={"version": 1}, headers=bob).status_code == 403
    assert team.client.post(promote, json={"version": 1}, headers=team.auth("carol")).status_code == 403
    schedule = {"name": f"steal-{team.names['bob']}", "cron": "0 4 * * *", "dataset": "nothing-yet/*.npz",
                "arch": "mlp", "model": name, "epochs": 1, "promote": "always"}
    refused = team.client.post("/api/v1/schedules", json=schedule, headers=bob)
    assert refused.status_code == 403 and name in refused.json()["detail"]
    train = {"kind": "train", "arch": "mlp", "dataset": "nothing.csv", "name": name}
    assert team.client.post("/api/v1/jobs", json=train, headers=bob).status_code == 403
    own = team.client.post("/api/v1/schedules", json={**schedule, "name": f"own-{team.names['alice']}"},
                           headers=alice)
    assert own.status_code == 201, own.text
    team.client.delete(f"/api/v1/schedules/own-{team.names['alice']}", headers=alice)


def test_a_fire_promotes_only_while_its_owner_may(team: Team, workers: Stack) -> None:
    """The schedule's owner's rights are checked again when its fire would promote."""
    url = workers.settings.database
    name = f"fired-{team.names['alice']}"
    added = workers.mxq_json("models", "add", name, "--arch", "mlp", "--input-shape", "64",
                             "--classes", "10", "--owner", team.names["alice"])
    assert (added["owner"], added["team"]) == (team.names["alice"], None)
    again = workers.mxq("models", "add", name, "--arch", "mlp", "--input-shape", "64",
                        "--team", team.team)  # an existing model keeps its owner and team
    assert again.returncode == 2 and "`mxq models share" in again.stderr
    policy = {"promote": "always", "metric": "val_accuracy", "min_gain": 0.0}
    with session_scope(url) as session:
        fires = [Fire(schedule_name="gone", policy=policy, fire_time=utcnow(), owner=team.names[who])
                 for who in ("bob", "alice")]
        session.add_all(fires)
        session.flush()
        ids = [f.id for f in fires]
    kept = schedules.decide_promotion(url, ids[0], name, 1, {})
    assert kept["decision"] == "kept" and "may not promote" in kept["reason"]
    assert schedules.decide_promotion(url, ids[1], name, 1, {})["decision"] == "promoted"


def test_idempotency_keys_are_per_owner(team: Team) -> None:
    probe = {"kind": "probe", "device": "cpu:7", "allow_offline": True, "size": 16}
    key = {"Idempotency-Key": f"key-{team.names['alice']}"}
    first = team.client.post("/api/v1/jobs", json=probe, headers={**team.auth("alice"), **key})
    assert first.status_code == 201
    others = team.client.post("/api/v1/jobs", json=probe, headers={**team.auth("dan"), **key})
    assert others.status_code == 201 and others.json()["owner"] == team.names["dan"]
    assert others.json()["id"] != first.json()["id"]
    replay = team.client.post("/api/v1/jobs", json=probe, headers={**team.auth("alice"), **key})
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    for changed in ({"priority": "high"}, {"preemptible": True}, {"team": team.team}):
        conflict = team.client.post("/api/v1/jobs", json={**probe, **changed},
                                    headers={**team.auth("alice"), **key})
        assert conflict.status_code == 409, changed
    for job in (first, others):
        team.client.post(f"/api/v1/jobs/{job.json()['id']}/cancel", headers=team.auth("admin"))


def test_the_dashboard_session_and_its_csrf_token(team: Team) -> None:
    browser = _client()
    assert browser.post("/api/v1/session", json={"token": "mxq_nope"}).status_code == 401
    login = browser.post("/api/v1/session", json={"token": team.tokens["dan"]})
    assert login.status_code == 200 and login.json()["user"] == team.names["dan"]
    cookie = login.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
    csrf = login.json()["csrf"]
    assert browser.get("/api/v1/jobs").status_code == 200  # the cookie alone reads
    assert browser.get("/api/v1/session").json()["csrf"] == csrf
    probe = {"kind": "probe", "device": "cpu:7", "allow_offline": True, "size": 16}
    forged = browser.post("/api/v1/jobs", json=probe)
    assert forged.status_code == 403 and "X-CSRF-Token" in forged.json()["detail"]
    assert browser.post("/api/v1/jobs", json=probe, headers={"X-CSRF-Token": "x" + csrf}).status_code == 403
    made = browser.post("/api/v1/jobs", json=probe, headers={"X-CSRF-Token": csrf})
    assert made.status_code == 201 and made.json()["owner"] == team.names["dan"]
    browser.post(f"/api/v1/jobs/{made.json()['id']}/cancel", headers={"X-CSRF-Token": csrf})
    stolen = dict(browser.cookies)
    assert browser.delete("/api/v1/session", headers={"X-CSRF-Token": csrf}).status_code == 204
    replayed = _client()
    replayed.cookies.update(stolen)
    assert replayed.get("/api/v1/jobs").status_code == 401  # logged out in SQL, not only here


def test_metrics_need_an_admin_or_the_scrape_token(team: Team) -> None:
    assert team.client.get("/metrics").status_code == 401
    assert team.client.get("/metrics", headers=team.auth("carol")).status_code == 403
    assert team.client.get("/metrics", headers=team.auth("alice")).status_code == 403
    scraped = team.client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert scraped.status_code == 200 and "mxq_jobs" in scraped.text
    assert team.client.get("/metrics", headers=team.auth("admin")).status_code == 200
    # The scrape token reads nothing else.
    assert team.client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
                           ).status_code == 401


def test_a_removed_users_name_is_never_given_again(team: Team, workers: Stack) -> None:
    url = workers.settings.database
    job = team.client.post("/api/v1/jobs", json={"kind": "probe", "device": "cpu:7", "allow_offline": True,
                                                 "size": 16}, headers=team.auth("bob")).json()
    users.remove(url, team.names["bob"])
    assert team.client.get("/api/v1/jobs", headers=team.auth("bob")).status_code == 401
    with pytest.raises(Exception, match="was removed"):
        users.add(url, team.names["bob"], Role.SUBMIT)
    assert team.client.get(f"/api/v1/jobs/{job['id']}", headers=team.auth("admin")).json()["owner"] \
        == team.names["bob"]
    team.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=team.auth("admin"))
    team.names.pop("bob")


def test_teams_through_the_cli_share_a_submit_with_their_members(team: Team, workers: Stack) -> None:
    """`mxq teams add|join|leave|ls|rm` and `--team` on a CLI submit (the local admin's)."""
    alice, carol, name = team.names["alice"], team.names["carol"], f"cli-{team.team}"
    assert workers.mxq("teams", "add", name, alice).returncode == 0
    assert workers.mxq("teams", "join", name, carol).returncode == 0
    listed = {t["name"]: t for t in workers.mxq_json("teams", "ls", "--json")}
    assert sorted(listed[name]["members"]) == sorted([alice, carol])
    job = workers.mxq_json("probe", "--device", "cpu:7", "--allow-offline", "--team", name, "--json")
    assert job["team"] == name
    predictions = f"/api/v1/jobs/{job['id']}/predictions"
    read = team.client.get(predictions, headers=team.auth("carol"))
    assert read.status_code != 403, read.text  # a member's read (the probe has not run: no rows)
    assert workers.mxq("teams", "leave", name, carol).returncode == 0
    assert team.client.get(predictions, headers=team.auth("carol")).status_code == 403
    assert workers.mxq("cancel", str(job["id"])).returncode == 0
    unknown = workers.mxq("probe", "--device", "cpu:7", "--allow-offline", "--team", "no-such-team")
    assert unknown.returncode == 2 and "no-such-team" in unknown.stderr.strip().splitlines()[-1]
    assert workers.mxq("teams", "rm", name).returncode == 0
    assert name not in {t["name"] for t in workers.mxq_json("teams", "ls", "--json")}


def test_a_jobs_log_is_read_by_its_owner_team_and_admins(team: Team, workers: Stack,
                                                         mlp: dict) -> None:
    """An inference job's worker log lines (what it ran, where) are in its log, which reads as
    its predictions do: 403 for another user, 404 for no job."""
    np.save(workers.home / "data" / "logged.npy", np.ones((300, 64), np.float32))
    # Its output to a file: a small job stored as rows may run as a member of another queued
    # job's merged batch, with no attempt (and no log) of its own.
    submitted = team.client.post("/api/v1/jobs", headers=team.auth("alice"), json={
        "kind": "infer", "model": "mlp64", "input": "logged.npy", "output": "npy", "team": team.team})
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    path = f"/api/v1/jobs/{job_id}/logs"
    page = wait_until(lambda: team.client.get(path, headers=team.auth("alice")).json(), 120,
                      f"job {job_id}'s log to end", until=lambda p: p["ended"])
    assert page["status"] == "succeeded"
    texts = [(line["source"], line["text"]) for line in page["items"]]
    assert texts[0][0] == "mxq" and texts[0][1].startswith("[mxq] attempt 1 started on ")
    assert any(source == "worker" and f"job {job_id}: mlp64:" in text for source, text in texts), texts
    assert texts[-1] == ("mxq", "[mxq] attempt 1 ended")
    for reader in ("carol", "admin"):
        assert team.client.get(path, headers=team.auth(reader)).json()["items"] == page["items"]
    later = team.client.get(path, params={"after": page["items"][0]["seq"]}, headers=team.auth("alice"))
    assert later.json()["items"] == page["items"][1:]
    refused = team.client.get(path, headers=team.auth("bob"))
    assert refused.status_code == 403 and team.names["alice"] in refused.json()["detail"]
    assert team.client.get("/api/v1/jobs/999999999/logs", headers=team.auth("admin")).status_code == 404
