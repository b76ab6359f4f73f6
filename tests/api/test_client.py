"""`mxq.client` against a real `mxq api` on a real stack, and the documentation's client example
(docs/python-client.md) run as written, on both backends."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from sqlalchemy import select

from mxq.client import Client, Job
from mxq.client import api as client_api
from mxq.db.engine import session_scope
from mxq.db.outputs import predictions
from mxq.db.schema import Job as JobRow
from mxq.db.sharing import users
from mxq.errors import Conflict, Forbidden, JobRejected, NotFound, Unauthorized, UserError
from mxq.json_types import JsonValue
from mxq.users import Role
from tests.api_server import Api, start_api
from tests.conftest import ROOT, Stack

pytestmark = pytest.mark.both_legs

TOKEN = "client-token-4a9b8c7d"


@pytest.fixture(scope="module")
def api(workers: Stack, mlp: dict) -> Iterator[Api]:
    yield from start_api(workers, TOKEN, "api-client")


def test_infer_wait_and_read_the_predictions(workers: Stack, api: Api) -> None:
    rows = np.random.default_rng(3).normal(size=(2500, 64)).astype(np.float32)
    np.save(workers.home / "data" / "client.npy", rows)
    with Client(api.url, token=TOKEN, poll_seconds=0.1) as client:
        job = client.infer("mlp64", "client.npy", device="cpu:1", top_k=2).wait(timeout=300)
        assert job.status == "succeeded" and len(job) == 2500 and job.record["device"] == "cpu:1"
        stored = predictions.read(workers.settings.database, job.id)
        got = job.predictions("numpy")
        assert got["index"].tolist() == [r["index"] for r in stored] == list(range(2500))
        assert got["predicted_class"].tolist() == [r["predicted_class"] for r in stored]
        table = job.predictions("arrow")
        assert table.num_rows == 2500 and table.column_names == ["index", "predicted_class", "score",
                                                                 "top_k"]
        frame = job.predictions("pandas")  # the `pandas` extra's pin, beside numpy 1.23.5
        assert list(frame.columns) == table.column_names and len(frame) == 2500
        assert frame["predicted_class"].tolist() == got["predicted_class"].tolist()
        assert job.id in [j.id for j in client.jobs(status="succeeded", since="1h", limit=1000)]


def test_wait_with_progress_draws_the_bar_on_stderr(workers: Stack, api: Api,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`wait(progress=True)` draws the bar `mxq --wait` draws (mxq.client.progress), on stderr:
    stdout is the caller's (the client's own bar once drew there)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # a terminal as Rich sees it, so the bar is drawn
    with Client(api.url, token=TOKEN, poll_seconds=0.1) as client:
        job = client.probe(device="cpu:0", size=64, batch=2, repeat=1).wait(timeout=300, progress=True)
    out, err = capsys.readouterr()
    assert job.status == "succeeded" and out == ""
    assert f"job {job.id} " in err and "%" in err, err


def test_errors_are_mxqs_own(workers: Stack, api: Api) -> None:
    with Client(api.url, token=TOKEN, poll_seconds=0.1) as client:
        with pytest.raises(NotFound, match="no job 987654"):
            client.job(987654)
        with pytest.raises(JobRejected, match="unknown model 'nosuch'") as rejected:
            client.infer("nosuch", "client.npy")
        assert client.job(rejected.value.job_id).status == "failed"  # recorded, as the CLI does
        with pytest.raises(UserError, match="batch_size=0"):
            client.infer("mlp64", "client.npy", batch_size=0)
        queued = client.probe(device="cpu:7", allow_offline=True)
        assert client.cancel(queued.id).status == "cancelled"
    with Client(api.url, token="not-the-token-at-all") as wrong, pytest.raises(Unauthorized):
        wrong.probe(device="cpu:0")


def test_the_documented_example_runs_as_written(workers: Stack, api: Api,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    section = (ROOT / "docs" / "python-client.md").read_text()
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "docs/python-client.md has no Python example"
    example = found.group(1)
    if "digits-demo" not in {m["name"] for m in workers.mxq_json("models")}:
        assert workers.mxq("models", "add", "digits-demo", "--arch", "lenet", "--input-shape", "1,8,8",
                           "--scale", "1/16").returncode == 0
    folder = workers.home / "data" / "mxq-demo"
    folder.mkdir(exist_ok=True)
    np.save(folder / "digits-raw-x20.npy", np.zeros((300, 1, 8, 8), np.float32))
    address = httpx.URL(api.url)
    env = {"MXQ_API_HOST": str(address.host), "MXQ_API_PORT": str(address.port),
           "MXQ_API_TOKEN": TOKEN}  # how `Client()` finds a stack, as the page says
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        exec(compile(example, "docs/python-client.md", "exec"), {})  # the page's own code
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out = capsys.readouterr().out
    assert "succeeded 300 samples at " in out and "[" in out, out


@pytest.fixture(scope="module")
def bare_api(stack: Stack) -> Iterator[Api]:
    """An API on the stack with no workers needed: offline probes stay queued."""
    yield from start_api(stack, TOKEN, "api-bare")


def _offline_probe(client: Client, key: str | None = None, size: int = 16) -> Job:
    return client.probe(device="cpu:7", allow_offline=True, idempotency_key=key, size=size,
                        batch=1, repeat=1)


def _jobs_with_key(stack: Stack, key: str) -> list[int]:
    with session_scope(stack.settings.database) as session:
        return list(session.scalars(select(JobRow.id).where(JobRow.idempotency_key == key)))


def test_an_idempotency_key_makes_a_retry_return_the_first_job(stack: Stack, bare_api: Api) -> None:
    key = f"retry-{uuid.uuid4()}"
    body = {"kind": "probe", "device": "cpu:7", "allow_offline": True, "size": 16, "batch": 1,
            "repeat": 1}
    with bare_api.client() as http:
        first = http.post("/api/v1/jobs", json=body, headers={**bare_api.auth, "Idempotency-Key": key})
        again = http.post("/api/v1/jobs", json=body, headers={**bare_api.auth, "Idempotency-Key": key})
        other = http.post("/api/v1/jobs", json={**body, "size": 32},
                          headers={**bare_api.auth, "Idempotency-Key": key})
        for bad in ("x" * 129, "has space", "new\\nline", ""):
            refused = http.post("/api/v1/jobs", json=body,
                                headers={**bare_api.auth, "Idempotency-Key": bad})
            assert refused.status_code == 422, (bad, refused.text)
            detail = refused.json()["detail"]
            assert "idempotency key" in detail and "\n" not in detail and len(detail) < 300
    assert first.status_code == 201 and first.json()["published"] is True
    assert first.json()["replayed"] is False
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.json()["replayed"] is True
    assert other.status_code == 409 and key in other.json()["detail"]
    assert _jobs_with_key(stack, key) == [first.json()["id"]]
    with Client(bare_api.url, token=TOKEN, poll_seconds=0.1) as client:  # the client's option, the same job
        job = _offline_probe(client, key)
        assert job.id == first.json()["id"] and job.replayed
        with pytest.raises(Conflict, match=key):
            _offline_probe(client, key, size=32)


def test_one_client_shared_by_threads_and_one_key_make_one_job(stack: Stack, bare_api: Api) -> None:
    """Many threads on one Client: each gets its own connections (an httpx.Client shared by
    200 threads once failed submits with EBADF), and racing submits with one key make one job."""
    key = f"race-{uuid.uuid4()}"
    with Client(bare_api.url, token=TOKEN, poll_seconds=0.1) as client:
        def submit(i: int) -> tuple[int, int, int]:
            keyed = _offline_probe(client, key)
            return keyed.id, _offline_probe(client).id, id(client.http)

        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(submit, range(48)))
    keyed, plain, connections = zip(*got, strict=True)
    assert len(set(keyed)) == 1 and _jobs_with_key(stack, key) == [keyed[0]]
    assert len(set(plain)) == 48  # every submit went through, once
    assert len(set(connections)) == 16  # one HTTP client per thread


def test_jobs_pages_by_id_while_jobs_are_submitted(stack: Stack, bare_api: Api,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Offset paging, newest first, repeated a job for every submit between two pages."""
    monkeypatch.setattr(client_api, "JOBS_PAGE", 5)
    with Client(bare_api.url, token=TOKEN) as client, Client(bare_api.url, token=TOKEN) as other:
        for _ in range(23):  # every page older than the first job it lists: none of the session's needed
            _offline_probe(client)
        newest = client.jobs(limit=1)[0].id
        asked = client.request

        def request_then_submit(method: str, path: str, params: client_api.Query | None = None,
                                json: object = None, headers: dict[str, str] | None = None
                                ) -> JsonValue:
            answer = asked(method, path, params, json, headers)
            if method == "GET" and path == "/jobs":
                _offline_probe(other)  # a submit between two pages
            return answer

        monkeypatch.setattr(client, "request", request_then_submit)
        ids = [j.id for j in client.jobs(limit=23)]
    assert len(ids) == 23 and len(set(ids)) == 23, ids
    assert ids == sorted(ids, reverse=True) and ids[0] == newest
    with bare_api.client() as http:
        page = http.get("/api/v1/jobs", params={"before_id": ids[4], "limit": 3}).json()
    assert [j["id"] for j in page["items"]] == ids[5:8]


def test_a_wrong_token_is_unauthorized_and_a_read_users_submit_forbidden(stack: Stack,
                                                                         bare_api: Api) -> None:
    """401 and 403 are different errors, so that a script can tell a missing token from a
    missing right (Forbidden is an Unauthorized: catch it first)."""
    name = f"reader-{uuid.uuid4().hex[:8]}"
    reader = users.add(stack.settings.database, name, Role.READ)
    try:
        with Client(bare_api.url, token="not-the-token-at-all") as wrong:
            with pytest.raises(Unauthorized) as unknown:
                _offline_probe(wrong)
            assert not isinstance(unknown.value, Forbidden)
        with Client(bare_api.url, token=reader) as client, pytest.raises(Forbidden, match="role read"):
            _offline_probe(client)
    finally:
        users.remove(stack.settings.database, name)


def test_predictions_follow_their_owner_and_team(workers: Stack, api: Api) -> None:
    """Through the client: alice's job shared with team ml is read by carol (ml, role read) and
    refused to bob (Forbidden), who sees its row without its result; no token, Unauthorized."""
    from mxq.db.sharing import teams

    url, run = workers.settings.database, uuid.uuid4().hex[:6]
    names = {who: f"{who}-c{run}" for who in ("alice", "bob", "carol")}
    made = {who: users.add(url, name, Role.READ if who == "carol" else Role.SUBMIT)
            for who, name in names.items()}
    team = f"ml-c{run}"
    teams.add_team(url, team)
    for who in ("alice", "carol"):
        teams.set_member(url, team, names[who])
    try:
        np.save(workers.home / "data" / "shared.npy", np.ones((30, 64), np.float32))
        with Client(api.url, token=made["alice"]) as alice:
            job = alice.infer("mlp64", "shared.npy", team=team).wait(timeout=300)
            assert job.status == "succeeded" and job.record["team"] == team
        with Client(api.url, token=made["carol"]) as carol:
            assert len(carol.job(job.id).predictions("numpy")) == 30
            line = carol.job(job.id).lineage()  # what produced it, read as its results are
            assert (line["model"], line["model_version"], line["owner"]) == ("mlp64", 1, names["alice"])
            result = job.record["result"]
            assert str(line["input"]).endswith("shared.npy") and line["output"] == "db"
            assert isinstance(result, dict) and line["engine"] == result["engine"]
            assert line["variant"] == "fp32"
            assert line["mxq_version"] and str(line["input_identity"]).startswith("file ")
            assert job.id in [r["job_id"] for r in carol.lineage(model="mlp64", version=1)]
        with Client(api.url, token=made["bob"]) as bob:
            seen = bob.job(job.id)
            assert seen.status == "succeeded" and seen.record["result"] is None
            with pytest.raises(Forbidden, match=names["alice"]):
                seen.predictions("numpy")
            with pytest.raises(Forbidden, match=names["alice"]):
                seen.lineage()
            assert job.id not in [r["job_id"] for r in bob.lineage(model="mlp64")]
        with Client(api.url) as anonymous, pytest.raises(Unauthorized) as refused:
            anonymous.jobs(limit=1)
        assert not isinstance(refused.value, Forbidden)
    finally:
        for name in names.values():
            users.remove(url, name)
        teams.remove_team(url, team)


def test_a_jobs_log_followed_through_the_client(workers: Stack, api: Api) -> None:
    np.save(workers.home / "data" / "client-log.npy", np.ones((500, 64), np.float32))
    with Client(api.url, token=TOKEN, poll_seconds=0.1) as client:
        job = client.infer("mlp64", "client-log.npy", device="cpu:1")
        lines = list(job.logs(follow=True))  # until the job ended and its last line is written
        assert job.refresh().status == "succeeded"
        assert lines[-1]["text"] == "[mxq] attempt 1 ended" and lines[-1]["source"] == "mxq"
        assert any(x["source"] == "worker" and f"job {job.id}: mlp64:" in str(x["text"]) for x in lines)
        assert [x["seq"] for x in lines] == sorted({int(str(x["seq"])) for x in lines})
        assert list(job.logs()) == lines


def test_retrain_submits_a_training_from_a_registered_version(stack: Stack, bare_api: Api) -> None:
    """`client.retrain` is `mxq train --from`: the version pinned at submit, the name defaulted."""
    added = stack.mxq("models", "add", "retrainable", "--arch", "mlp", "--input-shape", "64")
    assert added.returncode == 0, added.stderr
    with Client(bare_api.url, token=TOKEN, poll_seconds=0.1) as client:
        job = client.retrain("retrainable", "digits", device="cpu:7", allow_offline=True, reinit=True,
                             epochs=1)
        params = job.record["params"]
        assert isinstance(params, dict)
        assert (params["from_model"], params["from_version"], params["name"], params["reinit"],
                params["arch"]) == ("retrainable", 1, "retrainable", True, None)
        with pytest.raises(JobRejected, match="unknown model 'nosuch'"):  # a failed job says why
            client.retrain("nosuch", "digits", device="cpu:7", allow_offline=True)


def test_an_inference_schedule_added_and_read_through_the_client(workers: Stack, api: Api) -> None:
    """`schedule_inference` is `mxq schedule add --infer` (the API's POST /schedules/inference):
    the schedule is the token's user's; a request with both timings or neither is refused."""
    (workers.home / "data" / "client-inbox").mkdir(exist_ok=True)
    with Client(api.url, token=TOKEN, poll_seconds=0.1) as client:
        record = client.schedule_inference("client-inbox", "mlp64", "client-inbox/*.npy",
                                           every="15m", output="parquet", top_k=2)
        assert record["kind"] == "infer" and record["cron"] == "@every 15m"
        assert record["owner"] == "admin" and record["rescore"] == "low"
        spec = record["spec"]
        assert isinstance(spec, dict) and spec["output"] == "parquet" and spec["top_k"] == 2
        assert client.schedule("client-inbox")["fires"] == []
        for timing in ({"every": "15m", "cron": "0 3 * * *"}, {}):
            with pytest.raises(UserError, match="cron or every"):
                client.schedule_inference("client-bad", "mlp64", "client-inbox/*.npy", **timing)
        with pytest.raises(UserError, match="pins a version"):
            client.schedule_inference("client-bad", "mlp64:1", "client-inbox/*.npy", every="1h")
    assert workers.mxq("schedule", "rm", "client-inbox").returncode == 0  # no other test fires it
