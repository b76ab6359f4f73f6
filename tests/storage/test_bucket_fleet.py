"""A fleet of two nodes sharing one bucket and no folder: each node its own MXQ_HOME and data
root, the model registered on one and fetched from the bucket store by the other, a chunked job
reading one object and writing one Parquet object, and a node SIGKILLed while its job reads the
object and uploads its parts: the job resumes, the output is whole, nothing is duplicated."""

from __future__ import annotations

import io
import json
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from mxq.db import events
from mxq.db.registry import list_models
from mxq.db.stack import stack_id
from tests.conftest import Stack, _stack, wait_until
from tests.support.inference import committed_position
from tests.support.s3 import BUCKET, S3Server
from tests.training.test_multinode import NODES, kill_node, start_node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

OUT = f"s3://{BUCKET}/in/fleet-out"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, Any]]]:
    gen = _stack("embedded", tmp_path_factory.mktemp("bucket-fleet"), 10)
    stack = next(gen)
    stack.env["MXQ_S3_MODEL_STORE"] = f"s3://{BUCKET}/in/models"
    launchers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for core, node in enumerate(NODES):
            (stack.home / node / "data").mkdir(parents=True)  # a data root of its own, unshared
            stack.env["MXQ_DATA_ROOT"] = str(stack.home / node / "data")
            launchers[node] = start_node(stack, node, core)
        yield stack, launchers
    finally:
        for proc in launchers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        next(gen, None)


def _env(stack: Stack, node: str) -> dict[str, str]:
    return {"MXQ_HOME": str(stack.home / node), "MXQ_NODE": node,
            "MXQ_DATA_ROOT": str(stack.home / node / "data")}


def _add_model(stack: Stack) -> None:
    """The MLP both tests infer with, registered on node A unless it is already: each test stands
    alone (in two sessions, a file's tests may each get a fleet of their own)."""
    if list_models(stack.settings.database, "mlp64"):
        return
    add = stack.mxq("models", "add", "mlp64", "--arch", "mlp", "--input-shape", "64", "--classes",
                    "10", env=_env(stack, "nodeA"))
    assert add.returncode == 0, add.stderr


def _model_files(stack: Stack, node: str) -> list[Any]:
    return [p for p in (stack.home / node / "models").rglob("*") if p.is_file()]


def _object_rows(s3: S3Server, key: str) -> Any:
    return pq.read_table(io.BytesIO(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()))


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def _reference(stack: Stack, url: str) -> np.ndarray:
    proc = stack.mxq("infer", "mlp64", url, "--output", "npy", "--wait", "--json",
                     env=_env(stack, "nodeA"))
    record = json.loads(proc.stdout)
    assert record["status"] == "succeeded", record["error"]
    return np.load(record["output"]).argmax(axis=1)


def test_two_nodes_share_a_bucket_and_no_folder(fleet: tuple[Stack, dict[str, Any]]) -> None:
    stack, launchers = fleet
    s3 = S3Server.shared()
    _add_model(stack)
    assert not _model_files(stack, "nodeB")  # registered on node A only
    x = np.random.default_rng(7).normal(size=(60_000, 64)).astype(np.float32)
    url = s3.put("in/fleet.npy", _npy(x))
    expected = _reference(stack, url)

    proc = stack.mxq("infer", "mlp64", url, "--output", "parquet", "--output-to", OUT,
                     "--chunk-size", "7500", "--batch-size", "250", "--wait", "--json",
                     env=_env(stack, "nodeA"))
    job = json.loads(proc.stdout)
    assert job["status"] == "succeeded", job["error"]
    chunks = stack.mxq_json("jobs", "--limit", "100")
    nodes = {c["node"] for c in chunks if c.get("parent_id") == job["id"]}
    assert nodes == set(NODES), nodes  # the chunks ran on both nodes
    # Node B fetched what its engine serves (the ONNX export or the params) from the bucket.
    assert {p.name for p in _model_files(stack, "nodeB")} & {"model.onnx", "model-0000.params"}
    final = f"in/fleet-out/{stack_id(stack.settings.database)}/job-{job['id']}.parquet"
    table = _object_rows(s3, final)
    assert table.column("index").to_pylist() == list(range(60_000))
    assert np.array_equal(table.column("predicted_class").to_numpy(), expected)
    parts = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{final}.")
    assert parts.get("KeyCount", 0) == 0  # merged: no part object is left


def test_a_node_killed_mid_read_and_upload_leaves_one_whole_output(
        fleet: tuple[Stack, dict[str, Any]]) -> None:
    stack, launchers = fleet
    s3 = S3Server.shared()
    _add_model(stack)
    x = np.random.default_rng(8).normal(size=(300_000, 64)).astype(np.float32)
    url = s3.put("in/fleet-long.npy", _npy(x))
    proc = stack.mxq("infer", "mlp64", url, "--output", "parquet", "--output-to", OUT,
                     "--batch-size", "50", "--json", env=_env(stack, "nodeA"))
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["id"]
    wait_until(lambda: committed_position(stack, job_id), 240, f"job {job_id} to commit a flush",
               until=lambda done: done > 0, interval=0.2)
    node = stack.job(job_id)["node"]
    assert node in NODES, node
    kill_node(stack, node, launchers[node])  # its worker is reading and uploading parts
    assert committed_position(stack, job_id) < 300_000  # killed mid-job
    launchers[node] = start_node(stack, node, NODES.index(node))
    done = stack.wait(job_id, timeout=600)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] >= 2
    assert any(e["kind"] == events.RESUMED for e in events.list_events(stack.settings.database, job_id))
    table = _object_rows(s3, f"in/fleet-out/{stack_id(stack.settings.database)}/job-{job_id}.parquet")
    index = table.column("index").to_numpy()
    assert len(index) == 300_000 and np.array_equal(index, np.arange(300_000))  # none lost, none twice
    uploads = s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix="in/fleet-out/").get("Uploads", [])
    assert uploads == []  # nothing abandoned
