"""OpenLineage run events (issue 62): real workers run the jobs, the export's pass reads them from
SQL and sends them through the `openlineage-python` client's own transports, configured as its
users configure it (OPENLINEAGE__* variables, OPENLINEAGE_URL): a file, and an HTTP receiver."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from sqlalchemy import update

from mxq.db import jobs
from mxq.db.engine import session_scope
from mxq.db.jobs import Placement
from mxq.db.lineage import openlineage as outbox
from mxq.db.schema import Fire, OpenLineageRun, utcnow
from mxq.db.stack import stack_id
from mxq.workers.broker.app import celery_config
from mxq.workers.openlineage import sender
from mxq.workers.openlineage.events import run_id
from tests.conftest import Stack, free_port
from tests.support.inference import infer_and_wait, save_npy

pytestmark = pytest.mark.both_legs  # the export's scan is SQL: both backends


@pytest.fixture
def exporting(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """OpenLineage turned on for this test (the session turns it off), its client made afresh."""
    monkeypatch.delenv("OPENLINEAGE_DISABLED")
    sender.client.cache_clear()
    yield monkeypatch
    sender.client.cache_clear()


def _to_file(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "file")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__LOG_FILE_PATH", str(path))
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__APPEND", "true")


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_off_unless_configured_as_the_client_reads_it(exporting: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    exporting.chdir(tmp_path)
    exporting.setenv("HOME", str(tmp_path))
    assert not sender.configured()
    exporting.setenv("OPENLINEAGE_URL", "http://127.0.0.1:5000")
    assert sender.configured()
    exporting.setenv("OPENLINEAGE_DISABLED", "true")
    assert not sender.configured()
    exporting.delenv("OPENLINEAGE_DISABLED")
    exporting.delenv("OPENLINEAGE_URL")
    (tmp_path / "openlineage.yml").write_text("transport:\n  type: console\n")
    assert sender.configured()
    assert "mxq-openlineage" in celery_config(sender_settings())["beat_schedule"]


def sender_settings() -> Any:
    from mxq.workers.settings import get_settings

    return get_settings()


def test_every_inference_sends_start_and_its_end_with_its_datasets(
        workers: Stack, mlp: dict, exporting: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A job to Parquet: START, then COMPLETE naming its input file (its identity as the
    dataset's version) and its Parquet output with the file's schema and row count, the model
    version and engine as run facets. A job that fails: FAIL with its error. Sent once."""
    s = workers.settings
    events = tmp_path / "events.jsonl"
    _to_file(exporting, events)
    sender.send_due(s)  # the first pass: the export starts from the next job on
    assert _read(events) == []
    x = np.random.default_rng(5).normal(size=(300, 64)).astype(np.float32)
    path = save_npy(workers, "ol.npy", x)
    done = infer_and_wait(workers, "mlp64", "ol.npy", "--output", "parquet", "--device", "cpu:0")
    save_npy(workers, "ol-nan.npy", np.full((20, 64), np.nan, dtype=np.float32))
    bad = infer_and_wait(workers, "mlp64", "ol-nan.npy", "--device", "cpu:0")
    assert done["status"] == "succeeded" and bad["status"] == "failed", (done["error"], bad)
    assert sender.send_due(s) >= 3
    sent = _read(events)
    mine: dict[str, list[dict[str, Any]]] = {e["run"]["runId"]: [] for e in sent}
    for e in sent:
        mine[e["run"]["runId"]].append(e)
    ran = mine[run_id(stack_id(s.database), done["id"])]
    assert [e["eventType"] for e in ran] == ["START", "COMPLETE"]
    start, complete = ran
    assert complete["job"] == {**complete["job"], "namespace": "mxq", "name": "infer.mlp64"}
    assert start["inputs"][0]["namespace"] == "file" and start["inputs"][0]["name"] == str(path)
    record = workers.job(done["id"])
    params, result = record["params"], record["result"] or {}
    version = complete["inputs"][0]["facets"]["version"]["datasetVersion"]
    assert version == params["input_identity"]
    out = complete["outputs"][0]
    assert (out["namespace"], out["name"]) == ("file", done["output"])
    fields = [f["name"] for f in out["facets"]["schema"]["fields"]]
    assert fields == pq.read_schema(done["output"]).names
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 300
    model = complete["run"]["facets"]["mxq_model"]
    assert (model["name"], model["version"], model["engine"]) == \
        ("mlp64", result["model_version"], result["engine"])
    assert complete["run"]["facets"]["processing_engine"]["name"] == "mxq"
    failed = mine[run_id(stack_id(s.database), bad["id"])]
    assert failed[-1]["eventType"] == "FAIL"
    assert failed[-1]["run"]["facets"]["errorMessage"]["message"] == bad["error"]
    assert failed[-1]["outputs"] == []
    assert sender.send_due(s) == 0 and len(_read(events)) == len(sent)  # each event once


@contextmanager
def _lineage_receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append({"path": self.path, **json.loads(body)})
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", got
    finally:
        server.shutdown()


def test_a_receiver_that_is_down_gets_the_events_later_and_a_fire_is_the_parent(
        isolated: Stack, exporting: pytest.MonkeyPatch) -> None:
    """OPENLINEAGE_URL at a closed port: nothing is lost, the job waits its backoff; once the
    receiver answers, START and COMPLETE go, the training's schedule fire as their parent run."""
    s = isolated.settings
    exporting.setenv("OPENLINEAGE_URL", f"http://127.0.0.1:{free_port()}")
    outbox.due(s.database)  # the cursor: from the next job on
    job_id = jobs.create_job(s.database, "train", {"name": "nightly", "arch": "mlp", "dataset": "digits"},
                             "cpu:0", "q")
    assert jobs.take(s.database, job_id, Placement("cpu0@n", "n", "cpu:0"), 3, 60) is not None
    with session_scope(s.database) as session:
        session.add(Fire(schedule_name="nightly-retrain", fire_time=utcnow(), job_id=job_id))
    assert sender.send_due(s) == 0
    with session_scope(s.database) as session:
        row = session.get(OpenLineageRun, job_id)
        assert row is not None and row.attempts == 1 and row.started_sent_at is None
        assert "ConnectionError" in (row.last_error or "") or row.last_error
    assert sender.send_due(s) == 0  # its next try is not due yet
    with _lineage_receiver() as (url, got):
        exporting.setenv("OPENLINEAGE_URL", url)
        sender.client.cache_clear()
        with session_scope(s.database) as session:
            session.execute(update(OpenLineageRun).values(next_attempt_at=utcnow() - timedelta(seconds=1)))
        fence = jobs.take(s.database, job_id, Placement("cpu0@n", "n", "cpu:0"), 3, 60)
        jobs.fail(s.database, job_id, "boom", fence=fence if not isinstance(fence, jobs.Claim) else None)
        assert sender.send_due(s) == 2
    assert [e["eventType"] for e in got] == ["START", "FAIL"]
    assert got[0]["path"] == "/api/v1/lineage" and got[0]["job"]["name"] == "train.nightly"
    assert got[0]["inputs"][0]["namespace"] == "mxq" and got[0]["inputs"][0]["name"] == "datasets/digits"
    parent = got[0]["run"]["facets"]["parent"]
    assert parent["job"]["name"] == "schedule.nightly-retrain"
    assert got[1]["run"]["facets"]["errorMessage"]["message"] == "boom"
