"""Inputs in a bucket: the same samples as the local file in every format mxq reads from one,
streamed through bounded memory, confined to MXQ_S3_ALLOWED, and scored by real workers with
predictions equal to the local file's and the credentials in no log, row or answer."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text

from mxq.db.engine import get_engine
from mxq.db.stack import stack_id
from mxq.objects import ObjectURLError
from mxq.tasks.inference.inputs import InputError, count_samples, open_input
from mxq.workers.storage.client import StorageError
from mxq.workers.storage.locate import locate
from mxq.workers.storage.ranged import AHEAD, BLOCK_BYTES
from tests.conftest import Stack
from tests.support.inference import infer_and_wait, save_npy
from tests.support.s3 import BUCKET, S3Server


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def _encoded(kind: str, x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    if kind == "npy":
        np.save(buf, x)
    elif kind == "npz":
        np.savez_compressed(buf, X=x, y=np.arange(len(x)))
    elif kind == "csv":
        np.savetxt(buf, x, delimiter=",", fmt="%.9g")
    else:
        table = pa.table({"features": pa.array(list(x), type=pa.list_(pa.float32())),
                          "id": np.arange(len(x))})
        pq.write_table(table, buf, row_group_size=333)
    return buf.getvalue()


@pytest.fixture(scope="module")
def s3() -> S3Server:
    return S3Server.shared()


@pytest.mark.parametrize("kind", ["npy", "npz", "csv", "parquet"])
def test_an_object_reads_as_the_local_file_does(stack: Stack, s3: S3Server, tmp_path: Path,
                                                kind: str) -> None:
    x = np.random.default_rng(1).normal(size=(1000, 64)).astype(np.float32)
    data = _encoded(kind, x)
    url = s3.put(f"in/same.{kind}", data)
    local = tmp_path / f"same.{kind}"
    local.write_bytes(data)
    remote = locate(stack.settings, url)
    assert count_samples(remote) == count_samples(local) == 1000
    a, b = open_input(remote, (64,)), open_input(local, (64,))
    for start in range(0, 1000, 128):  # batches crossing the Parquet row groups and the blocks
        stop = min(start + 128, 1000)
        np.testing.assert_array_equal(a.read(start, stop), b.read(start, stop))
    assert str(a.path) == url  # messages name the object


def test_a_parquet_input_reads_numeric_columns_or_the_one_asked(stack: Stack, s3: S3Server) -> None:
    table = pa.table({"a": np.arange(10, dtype=np.int64), "b": np.linspace(0, 1, 10),
                      "label": pa.array(["x"] * 10)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=4)
    remote = locate(stack.settings, s3.put("in/cols.parquet", buf.getvalue()))
    src = open_input(remote, (2,), columns=["a", "b"])
    np.testing.assert_allclose(src.read(3, 9), np.stack([np.arange(3, 9), np.linspace(0, 1, 10)[3:9]], 1),
                               rtol=1e-6)
    with pytest.raises(InputError, match=r"choose the list column or the numeric columns"):
        open_input(remote, (2,))  # `label` is text: the sample's columns must be named
    with pytest.raises(InputError, match=r"columns label \(string\) are not numbers"):
        open_input(remote, (2,), columns=["a", "label"])
    with pytest.raises(InputError, match=r"has no column 'nope'; available: a \(int64\)"):
        open_input(remote, (1,), columns=["nope"])


def test_a_large_object_streams_through_a_few_blocks(stack: Stack, s3: S3Server) -> None:
    x = np.random.default_rng(2).normal(size=(400_000, 64)).astype(np.float32)  # 102 MB
    url = s3.put("in/large.npy", _npy(x))
    src = open_input(locate(stack.settings, url), (64,))
    tracemalloc.start()
    try:
        total = 0.0
        for start in range(0, len(x), 4096):
            total += float(src.read(start, min(start + 4096, len(x)))[:, 0].sum())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == pytest.approx(float(x[:, 0].sum()), rel=1e-4)
    # The blocks held (the one read and AHEAD in flight) and a batch, never the object.
    assert peak < (AHEAD + 2) * BLOCK_BYTES + 4 * 4096 * 64 * 4, peak
    assert peak < x.nbytes / 3


@pytest.mark.parametrize("where, error, needle", [
    ("s3://mxq-tests/elsewhere/x.npy", ObjectURLError,
     r"outside the allowed buckets and prefixes \(MXQ_S3_ALLOWED: mxq-tests/in\)"),
    ("s3://mxq-tests/input/x.npy", ObjectURLError, "outside the allowed"),  # a prefix is a folder
    ("s3://other-bucket/in/x.npy", ObjectURLError, "outside the allowed"),
    ("s3://mxq-tests/in/../elsewhere/x.npy", ObjectURLError, r"'\.\.' segment"),
    ("s3://Mxq_Tests/in/x.npy", ObjectURLError, "a bucket name is 3 to 63 lowercase"),
    ("s3://mxq-tests", ObjectURLError, "names no key"),
    ("s3://mxq-tests/in/missing.npy", StorageError,
     r"cannot read s3://mxq-tests/in/missing\.npy: it does not exist"),
])
def test_a_location_outside_the_allowed_ones_is_refused(stack: Stack, s3: S3Server, where: str,
                                                        error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle):
        locate(stack.settings, where)


def test_recordio_is_not_read_from_a_bucket(stack: Stack, s3: S3Server) -> None:
    remote = locate(stack.settings, s3.put("in/x.rec", b"\0" * 16))
    with pytest.raises(InputError, match=r"from local disk only; from object storage: \.npy, \.npz"):
        open_input(remote, (3, 8, 8))


def test_the_images_under_a_prefix_read_as_the_local_folder(stack: Stack, s3: S3Server,
                                                             tmp_path: Path) -> None:
    from tests.support.images import png_bytes, solid

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, name in enumerate(["b.png", "a.PNG", "c.png", "d.png"]):
        data = png_bytes(solid((40 * i, 100, 255 - 40 * i)))
        (folder / name).write_bytes(data)
        s3.put(f"in/scans/{name}", data)
    s3.put("in/scans/notes.txt", b"not an image")
    s3.put("in/scans/deeper/e.png", png_bytes(solid((1, 2, 3))))  # below the folder: not in it
    remote = locate(stack.settings, "s3://mxq-tests/in/scans/")
    assert count_samples(remote) == count_samples(folder) == 4
    np.testing.assert_array_equal(open_input(remote, (3, 8, 8)).read(0, 4),
                                  open_input(folder, (3, 8, 8)).read(0, 4))


def _rows(stack: Stack) -> str:
    """Every row of the job tables as text, as an operator's dump would hold them."""
    with get_engine(stack.settings.database).connect() as conn:
        return "\n".join(str(tuple(r)) for table in ("jobs", "job_events", "job_metrics", "workers")
                         for r in conn.execute(text(f"SELECT * FROM {table}")))


def test_workers_score_an_object_as_the_local_file(workers: Stack, mlp: dict, s3: S3Server) -> None:
    x = np.random.default_rng(4).normal(size=(20_000, 64)).astype(np.float32)
    save_npy(workers, "object-twin.npy", x)
    url = s3.put("in/twin.npy", _npy(x))
    local = infer_and_wait(workers, "mlp64", "object-twin.npy", "--batch-size", "512", "--output", "npy")
    remote = infer_and_wait(workers, "mlp64", url, "--batch-size", "512", "--output", "npy")
    assert local["status"] == remote["status"] == "succeeded", (local["error"], remote["error"])
    assert remote["params"]["input"] == url
    np.testing.assert_array_equal(np.load(remote["output"]), np.load(local["output"]))

    table = pa.table({"features": pa.array(list(x[:3000]), type=pa.list_(pa.float32())),
                      "id": np.arange(3000)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=1000)
    pq_url = s3.put("in/twin.parquet", buf.getvalue())
    by_columns = infer_and_wait(workers, "mlp64", pq_url, "--columns", "features", "--output", "npy")
    assert by_columns["status"] == "succeeded", by_columns["error"]
    np.testing.assert_allclose(np.load(by_columns["output"]), np.load(local["output"])[:3000], rtol=1e-6)

    refused = workers.mxq("infer", "mlp64", "s3://mxq-tests/elsewhere/x.npy")
    assert refused.returncode == 1  # recorded as a failed job, naming the setting, in one line
    assert "MXQ_S3_ALLOWED" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1

    seen: list[tuple[str, Any]] = [("rows", _rows(workers))]
    seen += [(str(p), p.read_bytes().decode(errors="replace")) for p in workers.home.rglob("*.log")]
    seen += [("job", json.dumps(workers.mxq_json("job", str(remote["id"]))))]
    for where, content in seen:
        assert s3.secret_key not in content and s3.access_key not in content, where
    assert BUCKET in seen[0][1]  # the rows do name the object


def _keys(s3: S3Server, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


@pytest.mark.parametrize("output", ["parquet", "npy"])
def test_a_chunked_job_writes_one_object_to_the_bucket(workers: Stack, mlp: dict, s3: S3Server,
                                                       output: str) -> None:
    x = np.random.default_rng(5).normal(size=(9_000, 64)).astype(np.float32)
    url = s3.put(f"in/chunked-{output}.npy", _npy(x))
    expected = np.load(infer_and_wait(workers, "mlp64", url, "--output", "npy")["output"])
    job = infer_and_wait(workers, "mlp64", url, "--output", output, "--output-to",
                         f"s3://mxq-tests/in/{output}-results/", "--chunk-size", "4000",
                         "--batch-size", "500")
    assert job["status"] == "succeeded", job["error"]
    final = f"in/{output}-results/{stack_id(workers.settings.database)}/job-{job['id']}.{output}"
    assert _keys(s3, f"in/{output}-results/") == [final]  # the parts are gone once merged
    assert job["output"] == f"s3://{BUCKET}/{final}"  # the parent names its chunks' one object
    body = io.BytesIO(s3.client().get_object(Bucket=BUCKET, Key=final)["Body"].read())
    if output == "npy":
        np.testing.assert_array_equal(np.load(body), expected)
    else:
        table = pq.read_table(body)
        assert table.column("index").to_pylist() == list(range(9_000))
        assert np.array_equal(table.column("predicted_class").to_numpy(), expected.argmax(axis=1))
        np.testing.assert_allclose(table.column("score").to_numpy(), expected.max(axis=1), rtol=1e-6)
    shown = workers.mxq("results", str(job["id"]))
    assert shown.returncode == 2 and f"s3://{BUCKET}/{final}" in shown.stderr


@pytest.mark.parametrize("args, needle", [
    (["--output", "parquet", "--output-to", "s3://mxq-tests/elsewhere"], "MXQ_S3_ALLOWED"),
    (["--output", "db", "--output-to", "s3://mxq-tests/in/results"], "takes --output parquet or npy"),
])
def test_an_output_outside_the_allowed_buckets_is_refused(workers: Stack, mlp: dict, s3: S3Server,
                                                          args: list[str], needle: str) -> None:
    url = s3.put("in/refused.npy", _npy(np.zeros((4, 64), dtype=np.float32)))
    proc = workers.mxq("infer", "mlp64", url, *args)
    assert proc.returncode == 1 and needle in proc.stderr, proc.stderr


def _digits_npz(n: int) -> bytes:
    from sklearn.datasets import load_digits

    d = load_digits()
    buf = io.BytesIO()
    np.savez(buf, X=d.data[:n].astype(np.float32) / 16, y=d.target[:n])
    return buf.getvalue()


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_a_schedule_trains_on_the_newest_object_of_a_bucket_prefix(workers: Stack, s3: S3Server) -> None:
    import time

    s3.put("in/daily/z-older.npz", _digits_npz(300))
    time.sleep(1.2)  # S3 keeps whole seconds: the newer one is newer by its time, not its name
    newer = s3.put("in/daily/a-newer.npz", _digits_npz(400))
    s3.put("in/daily/notes.txt", b"not a match")
    added = workers.mxq("schedule", "add", "bucket-nightly", "--cron", "0 3 * * *", "--arch", "mlp",
                        "--dataset", "s3://mxq-tests/in/daily/*.npz", "--model", "bucket-trained",
                        "--epochs", "1")
    assert added.returncode == 0, added.stderr
    try:
        fire = workers.mxq_json("schedule", "run-now", "bucket-nightly")
        assert fire["error"] is None and fire["dataset_file"] == newer
        job = workers.wait(fire["job_id"], timeout=300)
        assert job["status"] == "succeeded", job["error"]
        assert job["params"]["dataset"] == newer
        refused = workers.mxq("schedule", "add", "bucket-outside", "--cron", "0 3 * * *", "--arch",
                              "mlp", "--dataset", "s3://mxq-tests/elsewhere/*.npz", "--model", "x")
        assert refused.returncode == 2 and "MXQ_S3_ALLOWED" in refused.stderr, refused.stderr
    finally:
        workers.mxq("schedule", "rm", "bucket-nightly")


def test_a_model_is_added_from_files_in_a_bucket(workers: Stack, s3: S3Server, tmp_path: Path) -> None:
    import mxnet as mx

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, activation="tanh"), mx.gluon.nn.Dense(5))
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((1, 12)))
    net.export(str(tmp_path / "mine"))
    symbol = s3.put("in/models-src/mine-symbol.json", (tmp_path / "mine-symbol.json").read_bytes())
    params = s3.put("in/models-src/mine-0000.params", (tmp_path / "mine-0000.params").read_bytes())
    added = workers.mxq_json("models", "add", "from-bucket", "--symbol", symbol, "--params", params,
                             "--input-shape", "12")
    assert added["name"] == "from-bucket" and added["input_shape"] == [12] and added["classes"] == 5
    assert not list((workers.home / "staging").glob("*/mine-*"))  # the downloads are cleaned up
    refused = workers.mxq("models", "add", "nope", "--symbol", "s3://mxq-tests/elsewhere/s.json",
                          "--params", params, "--input-shape", "12")
    assert refused.returncode == 2 and "MXQ_S3_ALLOWED" in refused.stderr
