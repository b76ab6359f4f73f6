"""OpenLineage run events (issue 62): real workers run the jobs, the export's pass reads them from
SQL and sends them through the `openlineage-python` client's own transports, configured as its
users configure it (OPENLINEAGE__* variables, OPENLINEAGE_URL): a file, and an HTTP receiver."""

from __future__ import annotations

import json
import os
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
from openlineage.client.event_v2 import InputDataset, OutputDataset, Run, RunEvent, RunState
from openlineage.client.event_v2 import Job as OLJob
from openlineage.client.facet_v2 import dataset_version_dataset, schema_dataset
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
    """OpenLineage turned on for this test (the session turns it off), its client made afresh.
    The client writes variables of its own (OPENLINEAGE_URL becomes OPENLINEAGE__TRANSPORT__…):
    those go with the test, or the next test would find OpenLineage configured."""
    before = {k for k in os.environ if k.startswith("OPENLINEAGE")}
    monkeypatch.delenv("OPENLINEAGE_DISABLED")
    sender.client.cache_clear()
    yield monkeypatch
    sender.client.cache_clear()
    for name in [k for k in os.environ if k.startswith("OPENLINEAGE") and k not in before]:
        os.environ.pop(name)  # not through monkeypatch, whose undo would set them again


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


def _parsed(event: dict[str, Any]) -> RunEvent:
    """`event` read back into the client's own classes (their validators check the run id, the
    time, the URIs), with the facets this test reads."""
    def dataset(d: dict[str, Any], kind: type[InputDataset] | type[OutputDataset]) -> Any:
        facets: dict[str, Any] = {}
        if "version" in d["facets"]:
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
                datasetVersion=d["facets"]["version"]["datasetVersion"])
        if "schema" in d["facets"]:
            facets["schema"] = schema_dataset.SchemaDatasetFacet(fields=[
                schema_dataset.SchemaDatasetFacetFields(name=f["name"], type=f.get("type"))
                for f in d["facets"]["schema"]["fields"]])
        return kind(namespace=d["namespace"], name=d["name"], facets=facets)

    return RunEvent(eventType=RunState(event["eventType"]), eventTime=event["eventTime"],
                    run=Run(runId=event["run"]["runId"]),
                    job=OLJob(namespace=event["job"]["namespace"], name=event["job"]["name"]),
                    inputs=[dataset(d, InputDataset) for d in event["inputs"]],
                    outputs=[dataset(d, OutputDataset) for d in event["outputs"]],
                    producer=event["producer"])


def _runs(got: list[dict[str, Any]], stack: Stack, *job_ids: int) -> list[list[dict[str, Any]]]:
    """Each job's events as received, in order, every one parsed by the client's classes."""
    for event in got:
        _parsed(event)
    runs = {run_id(stack_id(stack.settings.database), j): j for j in job_ids}
    return [[e for e in got if runs.get(e["run"]["runId"]) == j] for j in job_ids]


def test_real_jobs_send_start_and_their_end_to_a_real_receiver(
        workers: Stack, mlp: dict, exporting: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through OPENLINEAGE_URL to a real HTTP server: an inference to Parquet (START, COMPLETE
    naming its input file with its identity as the version, and its Parquet file with the file's
    schema and row count; the model version and engine as run facets), a 2-device training
    (START, COMPLETE with the registered version as output), a failed inference (FAIL with its
    error). Each event is sent once."""
    s = workers.settings
    with _lineage_receiver() as (url, got):
        exporting.setenv("OPENLINEAGE_URL", url)
        sender.send_due(s)  # the first pass: the export starts from the next job on
        assert got == []
        x = np.random.default_rng(5).normal(size=(300, 64)).astype(np.float32)
        path = save_npy(workers, "ol.npy", x)
        done = infer_and_wait(workers, "mlp64", "ol.npy", "--output", "parquet", "--device", "cpu:0")
        save_npy(workers, "ol-nan.npy", np.full((20, 64), np.nan, dtype=np.float32))
        bad = infer_and_wait(workers, "mlp64", "ol-nan.npy", "--device", "cpu:0")
        trained = workers.mxq_json("train", "mlp", "digits", "--name", "olnet", "--devices", "2",
                                   "--epochs", "1", "--wait")
        assert (done["status"], bad["status"], trained["status"]) == ("succeeded", "failed", "succeeded")
        assert sender.send_due(s) == 6
        assert sender.send_due(s) == 0  # each event once
    inferred, failed, training = _runs(got, workers, done["id"], bad["id"], trained["id"])
    assert [e["eventType"] for e in inferred] == ["START", "COMPLETE"]
    assert {e["path"] for e in got} == {"/api/v1/lineage"}
    start, complete = inferred
    assert (complete["job"]["namespace"], complete["job"]["name"]) == ("mxq", "infer.mlp64")
    assert (start["inputs"][0]["namespace"], start["inputs"][0]["name"]) == ("file", str(path))
    record = workers.job(done["id"])
    params, result = record["params"], record["result"] or {}
    assert complete["inputs"][0]["facets"]["version"]["datasetVersion"] == params["input_identity"]
    out = complete["outputs"][0]
    assert (out["namespace"], out["name"]) == ("file", done["output"])
    assert [f["name"] for f in out["facets"]["schema"]["fields"]] == pq.read_schema(done["output"]).names
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 300
    model = complete["run"]["facets"]["mxq_model"]
    assert (model["name"], model["version"], model["engine"]) == \
        ("mlp64", result["model_version"], result["engine"])
    assert complete["run"]["facets"]["processing_engine"]["name"] == "mxq"
    assert [e["eventType"] for e in failed][-1] == "FAIL" and failed[-1]["outputs"] == []
    assert failed[-1]["run"]["facets"]["errorMessage"]["message"] == bad["error"]
    assert [e["eventType"] for e in training] == ["START", "COMPLETE"]
    assert training[1]["job"]["name"] == "train.olnet"
    assert training[0]["inputs"][0]["name"] == "datasets/digits"
    assert training[1]["outputs"][0]["name"] == "models/olnet"
    version = training[1]["outputs"][0]["facets"]["version"]["datasetVersion"]
    assert version == str((workers.job(trained["id"])["result"] or {})["model_version"])
    assert len(training[1]["run"]["facets"]["mxq_model"]["devices"]) == 2


def test_nothing_is_sent_when_not_configured(workers: Stack, mlp: dict) -> None:
    """The session's OPENLINEAGE_DISABLED (and no other OpenLineage setting): no pass sends."""
    assert not sender.configured()
    assert sender.send_due(workers.settings) == 0


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
    receiver answers, START and FAIL go, the training's schedule fire as their parent run, and a
    job cancelled while queued sends its ABORT alone."""
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
        cancelled = jobs.create_job(s.database, "infer", {"model": "m", "input": "/data/x.npy"},
                                    "cpu:0", "q")
        jobs.cancel(s.database, cancelled)  # queued: cancelled at once, never started
        assert sender.send_due(s) == 3
    assert [e["eventType"] for e in got] == ["START", "FAIL", "ABORT"]
    assert got[2]["job"]["name"] == "infer.m" and got[2]["outputs"] == []
    assert got[0]["path"] == "/api/v1/lineage" and got[0]["job"]["name"] == "train.nightly"
    assert got[0]["inputs"][0]["namespace"] == "mxq" and got[0]["inputs"][0]["name"] == "datasets/digits"
    parent = got[0]["run"]["facets"]["parent"]
    assert parent["job"]["name"] == "schedule.nightly-retrain"
    assert got[1]["run"]["facets"]["errorMessage"]["message"] == "boom"
