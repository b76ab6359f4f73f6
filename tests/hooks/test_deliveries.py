"""Real jobs on the session's workers deliver signed webhooks to a real HTTP server: every event
once per delivery id, its signature verified; a 500 retried until delivered; a redelivery by
hand is a second POST with the same id; a redirect to another host is not followed; a hung
endpoint is cut by the time limit while a job submitted meanwhile finishes; the secret is in no
listing, answer, metrics page or log line."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from mxq.api import routes
from mxq.api.app import app
from mxq.db.records import DeliveryRecord
from mxq.db.schema import utcnow
from mxq.db.webhooks import outbox
from mxq.workers.settings import Settings
from mxq.workers.webhooks import sender
from tests.conftest import Stack
from tests.hooks.receiver import Receiver, receiving, standard_verified

ALLOW = {"MXQ_HOOK_ALLOWED_HOSTS": "127.0.0.1"}
TOKEN = "hooks-admin-token-0123"


@pytest.fixture
def receiver(workers: Stack) -> Iterator[Receiver]:
    with receiving() as r:
        yield r
    for hook in workers.mxq_json("hooks", "ls"):  # the shared stack keeps no endpoint of ours
        if f":{r.port}/" in hook["url"]:
            assert workers.mxq("hooks", "rm", str(hook["id"])).returncode == 0


def _add(stack: Stack, receiver: Receiver, path: str) -> dict:
    proc = stack.mxq("hooks", "add", receiver.url(path), "--events", "job.finished,job.failed",
                     "--json", env=ALLOW)
    assert proc.returncode == 0, proc.stderr
    created = json.loads(proc.stdout)
    receiver.add(path, created)
    return created


def _probe(stack: Stack) -> int:
    job = stack.mxq_json("probe", "--device", "cpu:1", "--size", "16")
    assert stack.wait(job["id"])["status"] == "succeeded"
    return int(job["id"])


def _of(stack: Stack, hook_id: int, job_id: int) -> list[DeliveryRecord]:
    return [d for d in outbox.list_deliveries(stack.settings.database, hook_id, limit=10_000)
            if d["payload"]["job"]["id"] == job_id]


def _settings(stack: Stack) -> Settings:
    return stack.settings.model_copy(update={"hook_allowed_hosts": "127.0.0.1",
                                             "hook_timeout_seconds": 3.0})


def test_a_finished_job_is_delivered_signed_retried_and_redelivered(
        workers: Stack, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    s = _settings(workers)
    ok, flaky, moved = (_add(workers, receiver, p) for p in ("/ok", "/flaky", "/redirect"))
    job_id = _probe(workers)
    caplog.set_level(logging.INFO)
    now = utcnow()
    while sender.send_due(s, now, wait=True):  # other tests' jobs may have events too
        pass
    [delivered] = _of(workers, ok["id"], job_id)
    assert (delivered["status"], delivered["attempts"], delivered["last_code"]) == ("delivered", 1, 200)
    [got] = [r for r in receiver.on("/ok") if r.delivery == delivered["id"]]
    assert receiver.verified(got) and got.event == "job.finished"  # both ways, the library's too
    assert not standard_verified(receiver.standard_secrets["/ok"], got.standard,
                                 got.body.replace(b'"succeeded"', b'"failed"'))  # a tampered body
    body = json.loads(got.body)
    assert body["id"] == delivered["id"] and body["data"]["job"]["status"] == "succeeded"

    [retried] = _of(workers, flaky["id"], job_id)
    assert (retried["status"], retried["last_code"]) == ("failed", 500)
    while sender.send_due(s, now + timedelta(seconds=31), wait=True):
        pass
    [retried] = _of(workers, flaky["id"], job_id)
    assert (retried["status"], retried["attempts"], retried["last_code"]) == ("delivered", 2, 200)
    posts = [r for r in receiver.on("/flaky") if r.delivery == retried["id"]]
    assert len(posts) == 2 and all(receiver.verified(r) for r in posts)

    [redirected] = _of(workers, moved["id"], job_id)
    assert redirected["status"] == "failed" and redirected["last_code"] == 302
    assert "redirect to example.org (not followed)" in str(redirected["last_error"])

    again = workers.mxq("hooks", "redeliver", delivered["id"])
    assert again.returncode == 0, again.stderr
    while sender.send_due(s, wait=True):
        pass
    twice = [r for r in receiver.on("/ok") if r.delivery == delivered["id"]]
    assert len(twice) == 2 and all(receiver.verified(r) for r in twice)
    assert _of(workers, ok["id"], job_id)[0]["attempts"] == 2

    secrets = [ok["secret"], flaky["secret"], moved["secret"]]
    listed = workers.mxq("hooks", "ls").stdout + workers.mxq("hooks", "ls", "--json").stdout + \
        workers.mxq("hooks", "deliveries", "--json", "--limit", "10000").stdout
    api_settings = workers.settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: api_settings
    try:
        client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000),
                            headers={"Authorization": f"Bearer {TOKEN}"})
        answers = "".join(client.get(p).text for p in ("/api/v1/hooks", "/api/v1/hooks/deliveries",
                                                        "/metrics"))
        assert client.get("/api/v1/hooks").status_code == 200
    finally:
        app.dependency_overrides.clear()
    for secret in secrets:
        assert secret not in listed and secret not in answers and secret not in caplog.text


def test_a_hung_endpoint_is_cut_while_jobs_go_on(workers: Stack, receiver: Receiver) -> None:
    s = _settings(workers)
    hung = _add(workers, receiver, "/hang")
    first = _probe(workers)
    sending = threading.Thread(target=lambda: sender.send_due(s, wait=True))
    sending.start()  # the hung POST holds a sender's thread, never a worker
    second = _probe(workers)  # submitted while the delivery hangs: it runs and succeeds
    sending.join()
    [cut] = _of(workers, hung["id"], first)
    assert cut["status"] == "failed" and cut["last_code"] is None
    assert cut["last_error"] == "no answer within 3 s (MXQ_HOOK_TIMEOUT_SECONDS)"
    assert workers.job(second)["status"] == "succeeded"


def test_an_endpoint_outside_the_allowlist_is_refused_at_add(workers: Stack) -> None:
    refused = workers.mxq("hooks", "add", "http://127.0.0.1:9/x", "--events", "job.finished",
                          env={"MXQ_HOOK_ALLOWED_HOSTS": "hooks.example.com"})
    assert refused.returncode == 2 and "host 127.0.0.1 is not in MXQ_HOOK_ALLOWED_HOSTS" in refused.stderr
    assert all(":9/x" not in h["url"] for h in workers.mxq_json("hooks", "ls"))
