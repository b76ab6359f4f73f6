"""Bulk inference through real workers: every prediction stored once, equal to a direct run."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxq.db.outputs import predictions
from mxq.workers.fleet import leases
from mxq.workers.jobs.submit import submit
from tests.conftest import NODE, Stack, wait_until
from tests.support.inference import committed_position, infer_and_wait, predict_directly, save_npy
from tests.support.workers import pid_of, wait_alive


@pytest.mark.both_legs  # prediction rows: COPY on PostgreSQL, executemany on SQLite
def test_50000_samples_all_stored_and_equal_to_a_direct_run(workers: Stack, mlp: dict) -> None:
    x = np.random.default_rng(1).normal(size=(50_000, 64)).astype(np.float32)
    save_npy(workers, "big.npy", x)
    job = infer_and_wait(workers, "mlp64", "big.npy", "--device", "cpu:0", "--batch-size", "512",
                 "--top-k", "3")
    assert job["status"] == "succeeded", job["error"]
    assert job["samples"] == 50_000 and job["samples_per_sec"] > 0
    assert (job["model"], job["model_version"], job["device"]) == ("mlp64", 1, "cpu:0")
    url = workers.settings.database
    assert predictions.count(url, job["id"]) == 50_000
    rows = predictions.read(url, job["id"])
    assert [r["index"] for r in rows] == list(range(50_000))
    expected = predict_directly(workers, "mlp64", x)
    assert np.array_equal([r["predicted_class"] for r in rows], expected.argmax(axis=1))
    np.testing.assert_allclose([r["score"] for r in rows], expected.max(axis=1), rtol=1e-5)
    top = np.argsort(-expected[7])[:3]
    assert [c for c, _ in rows[7]["top_k"] or []] == top.tolist()
    record = workers.mxq_json("job", str(job["id"]))
    assert record["metrics"] and sum(m["samples"] for m in record["metrics"]) == 50_000


def test_results_cli_csv_and_json(workers: Stack, mlp: dict) -> None:
    x = np.random.default_rng(2).normal(size=(100, 64)).astype(np.float32)
    save_npy(workers, "small.npy", x)
    job = infer_and_wait(workers, "mlp64:1", "small.npy", "--top-k", "2", "--output", "both")
    assert job["status"] == "succeeded"
    out = workers.mxq("results", str(job["id"]), "--format", "csv", "--limit", "5")
    table = list(csv.reader(io.StringIO(out.stdout)))
    assert table[0] == ["index", "predicted_class", "score", "top_1", "top_score_1", "top_2",
                        "top_score_2"]
    assert len(table) == 6 and table[1][0] == "0"
    rows = json.loads(workers.mxq("results", str(job["id"]), "--format", "json").stdout)
    assert len(rows) == 100
    saved = np.load(job["output"])
    np.testing.assert_allclose(saved, predict_directly(workers, "mlp64", x), rtol=1e-5)
    assert [r["predicted_class"] for r in rows] == saved.argmax(axis=1).tolist()


def test_same_model_twice_is_loaded_once(workers: Stack, mlp: dict) -> None:
    save_npy(workers, "tiny.npy", np.ones((10, 64), np.float32))
    first = infer_and_wait(workers, "mlp64", "tiny.npy", "--device", "cpu:1")
    second = infer_and_wait(workers, "mlp64", "tiny.npy", "--device", "cpu:1")
    assert second["result"]["model_cache"] == "hit"
    assert first["status"] == second["status"] == "succeeded"


def test_a_worker_gives_back_its_memory_while_its_device_is_leased(workers: Stack, mlp: dict) -> None:
    """An idle worker whose device a training leases drops its cached models (and, on a GPU,
    MXNet's pool) for the training child: it kept them, gigabytes of a leased GPU (issue 45)."""
    save_npy(workers, "tiny.npy", np.ones((10, 64), np.float32))
    infer_and_wait(workers, "mlp64", "tiny.npy", "--device", "cpu:1")
    assert infer_and_wait(workers, "mlp64", "tiny.npy", "--device", "cpu:1")["result"]["model_cache"] == "hit"
    s, training, log = workers.settings, 10**9, workers.home / "logs" / f"cpu1-{NODE}.log"
    assert leases.acquire(s.broker, NODE, ["cpu:1"], training, ttl=60)
    try:
        wait_until(lambda: f"cpu:1 is leased by job {training}: gave back its memory" in log.read_text(),
                   30, "the leased worker to give back its memory", interval=0.2)
    finally:
        leases.release(s.broker, NODE, ["cpu:1"], training)
    after = infer_and_wait(workers, "mlp64", "tiny.npy", "--device", "cpu:1")
    assert after["status"] == "succeeded" and after["result"]["model_cache"] == "miss"


def test_nothing_is_given_back_under_a_running_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat thread frees caches only while the worker's main thread runs no delivery,
    and once per lease."""
    from types import SimpleNamespace

    from mxq.tasks.inference import device_memory
    from mxq.tasks.runner import DELIVERY
    from mxq.tasks.runtimes import onnx_runtime

    settings = SimpleNamespace(device="cpu:1", broker="redis://unused", node=NODE)
    monkeypatch.setattr(device_memory, "get_settings", lambda: settings)
    monkeypatch.setattr(leases, "holders", lambda *_: {"cpu:1": 7})
    monkeypatch.setattr(device_memory, "_given_to", [None])
    monkeypatch.setattr(onnx_runtime, "_sessions", {("in-use", 0, "cpu"): object()})
    with DELIVERY:
        device_memory.give_back_while_leased()
    assert len(onnx_runtime._sessions) == 1  # a job was using it
    device_memory.give_back_while_leased()
    assert not onnx_runtime._sessions and device_memory._given_to == [7]
    onnx_runtime._sessions[("loaded-since", 0, "cpu")] = object()
    device_memory.give_back_while_leased()  # the same lease: given back once
    assert len(onnx_runtime._sessions) == 1


@pytest.mark.both_legs  # chunks claimed and their parent settled in SQL
def test_chunked_job_spreads_over_devices_and_stores_each_row_once(workers: Stack,
                                                                   mlp: dict) -> None:
    x = np.random.default_rng(3).normal(size=(40_000, 64)).astype(np.float32)
    save_npy(workers, "chunked.npy", x)
    job = infer_and_wait(workers, "mlp64", "chunked.npy", "--chunk-size", "5000", "--batch-size", "256")
    assert job["status"] == "succeeded", job["error"]
    assert job["chunks"] == 8 and job["samples"] == 40_000 and job["samples_per_sec"] > 0
    children = [r for r in workers.mxq_json("jobs", "--limit", "1000") if r["parent_id"] == job["id"]]
    assert sorted(c["chunk_index"] for c in children) == list(range(8))
    assert {c["device"] for c in children} == {"cpu:0", "cpu:1"}
    rows = predictions.read(workers.settings.database, job["id"])
    assert [r["index"] for r in rows] == list(range(40_000))
    assert np.array_equal([r["predicted_class"] for r in rows],
                          predict_directly(workers, "mlp64", x).argmax(axis=1))


@pytest.mark.slow
def test_killed_mid_inference_resumes_without_duplicates(workers: Stack, mlp: dict) -> None:
    x = np.random.default_rng(4).normal(size=(300_000, 64)).astype(np.float32)
    save_npy(workers, "kill.npy", x)
    s = workers.settings
    job_id = submit(s, "infer", {"model": "mlp64", "input": "kill.npy", "batch_size": 128},
                    "cpu:0")
    deadline_record = workers.wait(job_id, until=("running",))
    # Its committed position (moved every flush), not its progress (written every 2 s): a fast
    # engine can run the whole job between two progress writes.
    wait_until(lambda: committed_position(workers, job_id), 120, f"job {job_id} to commit 5 %",
               until=lambda n: n >= 15_000, interval=0.01)
    pid = pid_of(workers, deadline_record["worker"])
    os.kill(pid, signal.SIGKILL)
    wait_alive(workers, f"cpu0@{NODE}", pid)
    done = workers.wait(job_id, timeout=600)
    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert predictions.count(s.database, job_id) == 300_000


def test_exported_model_added_with_the_cli_serves_a_job(workers: Stack, tmp_path: Path) -> None:
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, activation="tanh"), mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = np.random.default_rng(5).normal(size=(300, 12)).astype(np.float32)
    expected = mx.nd.softmax(net(mx.nd.array(x))).asnumpy()
    net.export(str(tmp_path / "mine"))
    added = workers.mxq("models", "add", "mine", "--symbol", str(tmp_path / "mine-symbol.json"),
                        "--params", str(tmp_path / "mine-0000.params"), "--input-shape", "12",
                        "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["classes"] == 4
    save_npy(workers, "mine.npy", x)
    job = infer_and_wait(workers, "mine", "mine.npy")
    assert job["status"] == "succeeded", job["error"]
    rows = predictions.read(workers.settings.database, job["id"])
    assert [r["predicted_class"] for r in rows] == expected.argmax(axis=1).tolist()
    np.testing.assert_allclose([r["score"] for r in rows], expected.max(axis=1), rtol=1e-5)


def test_exported_model_without_shape_or_with_wrong_params_is_refused(workers: Stack,
                                                                      tmp_path: Path) -> None:
    def export(name: str, width: int, prefix: str = "") -> None:
        net = mx.gluon.nn.HybridSequential(prefix=prefix or None)
        net.add(mx.gluon.nn.Dense(width), mx.gluon.nn.Dense(3))
        net.initialize()
        net.hybridize()
        net(mx.nd.zeros((1, 5)))
        net.export(str(tmp_path / name))

    export("a", 8, "same_")
    export("b", 9, "same_")  # same weight names, other shapes
    export("c", 8)  # other weight names
    no_shape = workers.mxq("models", "add", "a", "--symbol", str(tmp_path / "a-symbol.json"),
                           "--params", str(tmp_path / "a-0000.params"))
    assert no_shape.returncode == 2 and "pass --input-shape" in no_shape.stderr
    mismatch = workers.mxq("models", "add", "ab", "--symbol", str(tmp_path / "a-symbol.json"),
                           "--params", str(tmp_path / "b-0000.params"), "--input-shape", "5")
    assert mismatch.returncode == 2
    assert "does not match symbol" in mismatch.stderr
    assert len(mismatch.stderr.strip().splitlines()) == 1
    assert workers.mxq("models", "ab").returncode == 2  # nothing half-registered
    assert not (workers.home / "models" / "ab").exists()
    other = workers.mxq("models", "add", "ac", "--symbol", str(tmp_path / "a-symbol.json"),
                        "--params", str(tmp_path / "c-0000.params"), "--input-shape", "5")
    assert other.returncode == 2 and "it has no values for" in other.stderr


def test_a_float16_model_registers_and_serves_on_a_cpu(workers: Stack, tmp_path: Path) -> None:
    """Weights saved in float16 (as `--dtype float16` training on GPUs exports them): registered,
    and served on a CPU device by the net cast to float32, equal to a float32 run of the same
    float16-rounded weights."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, activation="relu"), mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = np.random.default_rng(8).normal(size=(200, 12)).astype(np.float32)
    net(mx.nd.array(x[:1]))
    net.export(str(tmp_path / "half"))
    params = tmp_path / "half-0000.params"
    halved = {k: v.astype("float16") for k, v in mx.nd.load(str(params)).items()}
    mx.nd.save(str(params), halved)  # what a float16 net's export writes
    for p in net.collect_params().values():  # the float32 reference sees the same rounded weights
        p.set_data(p.data().astype("float16").astype("float32"))
    expected = mx.nd.softmax(net(mx.nd.array(x))).asnumpy()
    added = workers.mxq("models", "add", "half", "--symbol", str(tmp_path / "half-symbol.json"),
                        "--params", str(params), "--input-shape", "12", "--json")
    assert added.returncode == 0, added.stderr
    save_npy(workers, "half.npy", x)
    job = infer_and_wait(workers, "half", "half.npy", "--device", "cpu:1")
    assert job["status"] == "succeeded", job["error"]
    rows = predictions.read(workers.settings.database, job["id"])
    assert [r["predicted_class"] for r in rows] == expected.argmax(axis=1).tolist()
    np.testing.assert_allclose([r["score"] for r in rows], expected.max(axis=1), rtol=1e-5)


@pytest.mark.slow  # seconds of real inference on a worker: make test-all (CI) runs it
@pytest.mark.parametrize("output", ["db", "parquet"])
def test_a_job_past_its_time_limit_stops_after_a_committed_flush_and_keeps_its_rows(
        workers: Stack, mlp: dict, output: str) -> None:
    """A limit of 1 s over an input that takes several seconds in batches of 16 on MXNet (ONNX
    Runtime in large batches, with the model cached, once scored it all within 1 s; the clock
    counts from the claim): the job stops at the first batch past it, once
    what it computed is flushed and committed, and fails naming the limit; the predictions of
    the committed samples stay, each once, in SQL or in the Parquet parts it kept, and equal a
    direct run's; `mxq results` prints them and then fails with the job's error."""
    x = np.random.default_rng(47).normal(size=(300_000, 64)).astype(np.float32)
    save_npy(workers, "limited.npy", x)
    job = infer_and_wait(workers, "mlp64", "limited.npy", "--device", "cpu:0", "--time-limit", "1",
                         "--output", output, "--engine", "mxnet", "--batch-size", "16")
    assert job["status"] == "failed" and job["params"]["time_limit"] == 1, job
    said = re.fullmatch(r"time limit 1s reached after \d+ s: stopped at sample (\d+) of 300000 "
                        r"\(the predictions before it are kept\)", job["error"] or "")
    assert said is not None, job["error"]
    stopped = int(said.group(1))
    assert 0 < stopped < 300_000
    assert committed_position(workers, job["id"]) == stopped  # stopped right after a committed flush
    shown = workers.mxq("results", str(job["id"]), "--format", "csv")
    assert shown.returncode == 1 and shown.stderr.strip() == f"mxq: job {job['id']} failed: {job['error']}"
    rows = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert [int(r["index"]) for r in rows] == list(range(stopped))
    assert np.array_equal([int(r["predicted_class"]) for r in rows],
                          predict_directly(workers, "mlp64", x[:stopped]).argmax(axis=1))
    assert len(predictions.read(workers.settings.database, job["id"])) == (stopped if output == "db" else 0)
