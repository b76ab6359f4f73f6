"""The HTTP API against a real database and broker, with real workers running the jobs."""

from __future__ import annotations

import csv
import io
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import insert

from mxq.api import routes
from mxq.api.app import app
from mxq.db import jobs
from mxq.db.engine import session_scope
from mxq.db.schema import JobMetric, utcnow
from mxq.status import JobKind
from mxq.tasks.training import datasets
from tests.conftest import FINAL, NODE, ROOT, Stack, wait_until

TOKEN = "s3cret-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(workers: Stack) -> Iterator[TestClient]:
    s = workers.settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: s
    yield TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000), headers=AUTH)
    app.dependency_overrides.clear()


def _done(client: TestClient, job_id: int, timeout: float = 300) -> dict:
    return wait_until(lambda: client.get(f"/api/v1/jobs/{job_id}").json(), timeout,
                      f"job {job_id} to finish", until=lambda job: job["status"] in FINAL)


def test_submit_probe_infer_and_train_then_read_them_back(client: TestClient, workers: Stack,
                                                          mlp: dict) -> None:
    probe = client.post("/api/v1/jobs", json={"kind": "probe", "device": "cpu:1", "size": 64},
                        headers=AUTH)
    assert probe.status_code == 201 and probe.json()["queue"] == f"{NODE}.cpu.1"
    assert _done(client, probe.json()["id"])["status"] == "succeeded"

    np.save(workers.home / "data" / "api.npy", np.ones((300, 64), np.float32))
    infer = client.post("/api/v1/jobs", json={"kind": "infer", "model": "mlp64", "input": "api.npy",
                                              "batch_size": 100}, headers=AUTH).json()
    job = _done(client, infer["id"])
    assert job["status"] == "succeeded" and job["metrics"] and job["output"] == "db"
    page = client.get(f"/api/v1/jobs/{infer['id']}/predictions", params={"limit": 100, "offset": 250})
    assert page.json()["total"] == 300 and [r["index"] for r in page.json()["items"]] == list(range(250, 300))
    csv_text = client.get(f"/api/v1/jobs/{infer['id']}/predictions",
                          params={"format": "csv", "limit": 2}).text
    assert csv_text.splitlines()[0] == "index,predicted_class,score" and len(csv_text.splitlines()) == 3
    values = client.get(f"/api/v1/jobs/{infer['id']}/values")  # SQL rows: the client's mistake
    assert values.status_code == 422, values.text
    assert f"read its predictions (GET /api/v1/jobs/{infer['id']}/predictions" in values.json()["detail"]

    train = client.post("/api/v1/jobs", json={"kind": "train", "arch": "mlp", "dataset": "digits",
                                              "name": "api-model", "epochs": 1}, headers=AUTH).json()
    trained = _done(client, train["id"])
    assert trained["status"] == "succeeded" and len(trained["epochs"]) == 1
    versions = client.get("/api/v1/models/api-model").json()
    assert [v["version"] for v in versions] == [1]
    assert client.post("/api/v1/models/api-model/promote", json={"version": 1},
                       headers=AUTH).json()["promoted"] is True
    assert any(m["name"] == "api-model" for m in client.get("/api/v1/models").json())


def test_job_list_filters_and_pages(client: TestClient, workers: Stack) -> None:
    ids = [client.post("/api/v1/jobs", json={"kind": "probe", "device": "cpu:0", "size": 32},
                       headers=AUTH).json()["id"] for _ in range(5)]
    for i in ids:
        _done(client, i)
    first = client.get("/api/v1/jobs", params={"kind": "probe", "device": "cpu:0", "limit": 2}).json()
    second = client.get("/api/v1/jobs", params={"kind": "probe", "device": "cpu:0", "limit": 2,
                                                "offset": 2}).json()
    assert first["total"] == second["total"] >= 5 and first["limit"] == 2
    assert [j["id"] for j in first["items"]] == ids[::-1][:2]
    assert [j["id"] for j in second["items"]] == ids[::-1][2:4]
    recent = client.get("/api/v1/jobs", params={"kind": "probe", "since": "2h", "limit": 1000})
    assert recent.status_code == 200 and set(ids) <= {j["id"] for j in recent.json()["items"]}
    assert client.get("/api/v1/jobs", params={"since": "2099-01-01T00:00"}).json()["total"] == 0
    bad = client.get("/api/v1/jobs", params={"since": "yesterday"})
    assert bad.status_code == 422 and "use an age such as 30m" in bad.json()["detail"]
    failed = client.get("/api/v1/jobs", params={"status": "failed", "limit": 1000}).json()
    assert all(j["status"] == "failed" for j in failed["items"])
    devices = client.get("/api/v1/devices").json()
    assert {d["device"] for d in devices if d["alive"]} == {"cpu:0", "cpu:1"}
    assert all({"alive", "queued", "running", "leased_by", "heartbeat_age"} <= set(d) for d in devices)


def test_a_large_total_is_counted_only_past_the_page(client: TestClient, workers: Stack,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """At 10 million jobs an exact total cost a read of every match on each dashboard refresh."""
    for _ in range(12):
        jobs.create_job(workers.settings.database, JobKind.ARCH, {}, "auto", "nowhere", rejected="test")
    monkeypatch.setattr(routes, "TOTAL_COUNTED", 3)
    first = client.get("/api/v1/jobs", params={"kind": JobKind.ARCH, "limit": 2}).json()
    assert (first["total"], first["total_capped"], len(first["items"])) == (5, True, 2)
    last = client.get("/api/v1/jobs", params={"kind": JobKind.ARCH, "limit": 2, "offset": 8}).json()
    assert (last["total"], last["total_capped"], len(last["items"])) == (12, False, 2)


def test_schedules_crud(client: TestClient, workers: Stack) -> None:
    body = {"name": "api-nightly", "cron": "0 4 * * *", "tz": "Europe/Berlin",
            "dataset": "nothing-yet/*.npz", "arch": "mlp", "model": "api-nightly", "epochs": 1}
    created = client.post("/api/v1/schedules", json=body, headers=AUTH)
    assert created.status_code == 201 and created.json()["enabled"] is True
    assert client.post("/api/v1/schedules", json=body, headers=AUTH).status_code == 409
    assert "api-nightly" in {s["name"] for s in client.get("/api/v1/schedules").json()}
    assert client.post("/api/v1/schedules/api-nightly/pause", headers=AUTH).json()["enabled"] is False
    assert client.post("/api/v1/schedules/api-nightly/resume", headers=AUTH).json()["enabled"] is True
    fired = client.post("/api/v1/schedules/api-nightly/run-now", headers=AUTH)
    assert fired.status_code == 202  # recorded; the schedule process resolves and submits it
    assert [(f["manual"], f["job_id"], f["error"]) for f in fired.json()["fires"]] == [(True, None, None)]
    assert client.delete("/api/v1/schedules/api-nightly", headers=AUTH).status_code == 204
    assert client.get("/api/v1/schedules/api-nightly").status_code == 404


def test_cancel_through_the_api(client: TestClient) -> None:
    queued = client.post("/api/v1/jobs", json={"kind": "probe", "device": "cpu:9", "allow_offline": True},
                         headers=AUTH).json()
    assert queued["status"] == "queued" and queued["queue"] == f"{NODE}.cpu.9"
    answer = client.post(f"/api/v1/jobs/{queued['id']}/cancel", headers=AUTH).json()
    assert answer["outcome"] == "cancelled" and answer["status"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{queued['id']}/cancel", headers=AUTH).json()
    assert again["outcome"] == "finished"


def _probe(client: TestClient, device: str, size: int) -> dict:
    """A probe job through the API, finished."""
    r = client.post("/api/v1/jobs", json={"kind": "probe", "device": device, "size": size}, headers=AUTH)
    return _done(client, r.json()["id"])


def test_openapi_metrics_and_dashboard(client: TestClient, workers: Stack, mlp: dict) -> None:
    assert _probe(client, "cpu:0", 32)["status"] == "succeeded"
    np.save(workers.home / "data" / "rates.npy", np.ones((2000, 64), np.float32))
    infer = client.post("/api/v1/jobs", json={"kind": "infer", "model": "mlp64", "input": "rates.npy",
                                              "device": "cpu:1"}, headers=AUTH).json()
    assert _done(client, infer["id"])["status"] == "succeeded"  # a throughput point on cpu:1
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/cancel",
                 "/api/v1/jobs/{job_id}/predictions", "/api/v1/devices", "/api/v1/models",
                 "/api/v1/schedules"):
        assert path in paths
    metrics = client.get("/metrics").text
    assert 'mxq_jobs{kind="probe",status="succeeded"}' in metrics
    assert 'mxq_queue_depth{device="cpu:0",node="testnode"}' in metrics
    assert "mxq_device_samples_per_second" in metrics and "mxq_job_duration_seconds_sum" in metrics
    rates = [ln for ln in metrics.splitlines() if ln.startswith("mxq_device_samples_per_second{")]
    # (the session's stack is shared: other tests' nodes may have rates too)
    assert all('node="' in ln and 'device="' in ln for ln in rates), rates
    assert any(f'node="{NODE}"' in ln and 'device="cpu:' in ln for ln in rates), rates
    page = client.get("/")
    assert page.status_code == 200 and 'id="jobs-table"' in page.text


def test_the_api_refuses_a_public_address_without_a_token(workers: Stack) -> None:
    proc = workers.mxq_process("api", env={"MXQ_API_HOST": "0.0.0.0"}, timeout=60)
    assert proc.returncode == 2
    assert "refusing to serve on 0.0.0.0 without MXQ_API_TOKEN" in proc.stderr


def test_exports_and_stats(client: TestClient, workers: Stack) -> None:
    assert _probe(client, "cpu:1", 32)["status"] == "succeeded"
    rows = list(csv.DictReader(io.StringIO(workers.mxq("jobs", "--format", "csv", "--limit", "1000").stdout)))
    as_json = workers.mxq_json("jobs", "--limit", "1000")
    assert [int(r["id"]) for r in rows] == [j["id"] for j in as_json]
    assert {"id", "kind", "status", "device", "samples_per_sec", "error"} <= set(rows[0])
    stats = {r["device"]: r for r in workers.mxq_json("stats", "--by", "device")}
    for device, r in stats.items():
        done = [j for j in as_json if j["device"] == device]
        assert r["jobs"] == len(done)
        assert r["succeeded"] == sum(j["status"] == "succeeded" for j in done)
    assert all(0 <= r["success_rate"] <= 1 for r in stats.values() if r["success_rate"] is not None)
    by_day = workers.mxq_json("stats", "--by", "day")
    assert by_day and len(by_day[0]["day"]) == 10
    assert workers.mxq("stats", "--by", "week").returncode == 2


def test_a_parquet_jobs_predictions_are_served_from_its_file(client: TestClient, workers: Stack,
                                                             mlp: dict) -> None:
    np.save(workers.home / "data" / "api-pq.npy",
            np.random.default_rng(9).normal(size=(400, 64)).astype(np.float32))
    submitted = client.post("/api/v1/jobs", json={"kind": "infer", "model": "mlp64", "input": "api-pq.npy",
                                                  "output": "parquet", "top_k": 2}, headers=AUTH)
    assert submitted.status_code == 201, submitted.text
    job = _done(client, submitted.json()["id"])
    assert job["status"] == "succeeded" and job["output"].endswith(f"job-{job['id']}.parquet")
    page = client.get(f"/api/v1/jobs/{job['id']}/predictions", params={"limit": 50, "offset": 390}).json()
    assert page["total"] == 400 and [r["index"] for r in page["items"]] == list(range(390, 400))
    assert all(len(r["top_k"]) == 2 and r["top_k"][0][0] == r["predicted_class"] for r in page["items"])
    api_csv = client.get(f"/api/v1/jobs/{job['id']}/predictions", params={"format": "csv", "limit": 5}).text
    cli_csv = workers.mxq("results", str(job["id"]), "--format", "csv", "--limit", "5").stdout
    assert api_csv == cli_csv and api_csv.splitlines()[0] == \
        "index,predicted_class,score,top_1,top_score_1,top_2,top_score_2"


@pytest.mark.both_legs  # merged in SQL: integer division and grouping on either backend
def test_a_jobs_throughput_is_merged_to_the_points_asked(client: TestClient, workers: Stack) -> None:
    """A long job's chart gets at most `points` per device, and merging keeps every sample."""
    url = workers.settings.database
    job_id = jobs.create_job(url, "infer", {}, "auto", "pool.cpu", "a job with synthetic points")
    start = utcnow()
    with session_scope(url) as session:
        session.execute(insert(JobMetric), [
            {"job_id": job_id, "step": i, "at": start + timedelta(seconds=i),
             "device": f"cpu:{i % 2}", "samples": 100 + i % 7, "seconds": 1.0 + i % 3,
             "samples_per_sec": (100 + i % 7) / (1.0 + i % 3)} for i in range(5000)])
    whole = client.get(f"/api/v1/jobs/{job_id}").json()["metrics"]
    merged = client.get(f"/api/v1/jobs/{job_id}", params={"points": 400}).json()["metrics"]
    assert len(whole) == 5000
    for device in ("cpu:0", "cpu:1"):
        points = [p for p in merged if p["device"] == device]
        assert 0 < len(points) <= 400
        assert sum(p["samples"] for p in points) == sum(p["samples"] for p in whole if p["device"] == device)
        assert sum(p["seconds"] for p in points) == pytest.approx(
            sum(p["seconds"] for p in whole if p["device"] == device))
        assert all(p["samples_per_sec"] == pytest.approx(p["samples"] / p["seconds"]) for p in points)
    assert [p["at"] for p in merged] == sorted(p["at"] for p in merged)
    assert client.get(f"/api/v1/jobs/{job_id}", params={"points": 1}).status_code == 422


def test_every_error_is_a_problem_document(client: TestClient) -> None:
    """RFC 9457 for mxq's errors and the framework's own (no route, wrong method)."""
    answers = {"no job": client.get("/api/v1/jobs/987654"),
               "no route": client.get("/api/v1/nothing-here"),
               "bad query": client.get("/api/v1/jobs", params={"limit": 0}),
               "no token": TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
               .post("/api/v1/jobs", json={"kind": "probe"}),
               "wrong method": client.options("/api/v1/schedules/nightly")}
    for what, r in answers.items():
        assert r.headers["content-type"] == "application/problem+json", what
        body = r.json()
        assert body["status"] == r.status_code and body["type"] == "about:blank", (what, body)
        assert body["title"] and body["detail"] and set(body) <= {"type", "title", "status", "detail",
                                                                  "job_id"}, (what, body)
    assert [r.status_code for r in answers.values()] == [404, 404, 422, 401, 405]
    # Every method the path has, not just those of the first route Starlette matched.
    assert answers["wrong method"].headers["allow"] == "DELETE, GET, HEAD"


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_run_now_hands_the_fire_to_the_schedule_process(client: TestClient, workers: Stack) -> None:
    """The API never walks a dataset glob itself: the schedule process (`mxq scheduler`, the
    `mxq.fire` task) resolves the fire's dataset and submits its training."""
    folder = workers.home / "data" / "handover"
    folder.mkdir(exist_ok=True)
    d = datasets.digits().for_training()
    np.savez(folder / "day1.npz", X=d.x.reshape(len(d.y), -1)[:200], y=d.y[:200])
    body = {"name": "handover", "cron": "0 4 * * *", "dataset": "handover/*.npz", "arch": "mlp",
            "model": "handover", "epochs": 1}
    assert client.post("/api/v1/schedules", json=body, headers=AUTH).status_code == 201
    scheduler = subprocess.Popen([sys.executable, "-m", "mxq.cli", "scheduler"], cwd=ROOT,
                                 env=workers.environ(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    try:
        assert client.post("/api/v1/schedules/handover/run-now", headers=AUTH).status_code == 202
        fire = wait_until(lambda: client.get("/api/v1/schedules/handover").json()["fires"][-1], 120,
                          "the schedule process to submit the fire", until=lambda f: f["job_id"])
        assert fire["dataset_file"].endswith("handover/day1.npz") and fire["error"] is None
        assert workers.wait(fire["job_id"])["status"] == "succeeded"
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.wait(timeout=60)
        client.delete("/api/v1/schedules/handover", headers=AUTH)
