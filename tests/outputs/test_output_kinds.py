"""Models that are not classifiers (issue 48): an embedding, regression values, multi-label
probabilities. Registered with `--outputs KIND` (a width-1 output detected as regression),
served by real workers on both engines, stored as `.npy` (N x width) and Parquet (`output` as a
fixed-size list: pyarrow and DuckDB read arrays), SQL rows only where a row holds them, and an
int8 variant judged by the kind's own measure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import mxnet as mx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mxq.db.outputs import predictions, results
from mxq.tasks.model_store import output_kinds
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.mxnet.versions import add_exported
from mxq.tasks.model_store.variants import Calibration, build_variant
from mxq.workers.settings import Settings
from tests.conftest import Stack
from tests.support.inference import infer_and_wait, save_npy

SHAPE = (1, 8, 8)


def _export(folder: Path, name: str, blocks: list[mx.gluon.HybridBlock],
            shape: tuple[int, ...] = SHAPE) -> tuple[Path, Path, mx.gluon.HybridBlock]:
    """A user's net of `blocks`, seeded, exported: (symbol, params, net)."""
    mx.random.seed(7)
    net = mx.gluon.nn.HybridSequential()
    net.add(*blocks)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, *shape)))
    net.export(str(folder / name))
    return folder / f"{name}-symbol.json", folder / f"{name}-0000.params", net


def _embedder() -> list[mx.gluon.HybridBlock]:
    """A CNN without its classifier layer: a 128-d embedding per sample."""
    nn = mx.gluon.nn
    return [nn.Conv2D(8, 3, padding=1, activation="relu"), nn.BatchNorm(), nn.MaxPool2D(2),
            nn.Flatten(), nn.Dense(128)]


def _regressor() -> list[mx.gluon.HybridBlock]:
    return [mx.gluon.nn.Flatten(), mx.gluon.nn.Dense(16, activation="tanh"), mx.gluon.nn.Dense(1)]


def _tagger() -> list[mx.gluon.HybridBlock]:
    """Six independent labels: a sigmoid per label."""
    return [mx.gluon.nn.Flatten(), mx.gluon.nn.Dense(16, activation="tanh"), mx.gluon.nn.Dense(6),
            mx.gluon.nn.Activation("sigmoid")]


def _add(stack: Stack, name: str, symbol: Path, params: Path, *options: str) -> dict[str, Any]:
    proc = stack.mxq("models", "add", name, "--symbol", str(symbol), "--params", str(params),
                     "--input-shape", "1,8,8", *options, "--json")
    assert proc.returncode == 0, proc.stderr
    record: dict[str, Any] = json.loads(proc.stdout)
    return record


def _samples(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float32)


def test_registration_records_the_kind_and_checks_it(store: Settings, tmp_path: Path) -> None:
    symbol, params, _ = _export(tmp_path, "emb", _embedder())
    emb = add_exported(store, "kinds-emb", symbol, params, SHAPE, outputs="embedding")
    assert (emb["outputs"], emb["classes"]) == ("embedding", 128)
    assert emb["onnx"] is not None and emb["onnx"]["argmax_agreement"] == 1.0, emb["onnx"]
    assert "cosine" in emb["onnx"]["measure"]

    symbol, params, _ = _export(tmp_path, "reg", _regressor())
    reg = add_exported(store, "kinds-reg", symbol, params, SHAPE)  # auto: one value is regression
    assert (reg["outputs"], reg["classes"]) == ("regression", 1)
    with pytest.raises(ModelError, match=r"--outputs regression for one value"):
        add_exported(store, "kinds-reg", symbol, params, SHAPE, outputs="logits")

    with pytest.raises(ModelError, match=r"--outputs multilabel: .* not in \[0, 1\] \(end the net in a"):
        add_exported(store, "kinds-emb", *_export(tmp_path, "raw", _embedder())[:2], SHAPE,
                     outputs="multilabel")
    symbol, params, _ = _export(tmp_path, "tags", _tagger())
    tags = add_exported(store, "kinds-tags", symbol, params, SHAPE, outputs="multilabel")
    assert (tags["outputs"], tags["classes"]) == ("multilabel", 6)


def test_each_kind_agrees_by_its_own_measure() -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((100, 16)).astype(np.float32)
    scaled = base * 3  # the same directions: an embedding agrees; regression values do not
    assert output_kinds.agreement("embedding", scaled, base) == 1.0
    assert output_kinds.agreement("regression", scaled, base) < 0.05
    assert output_kinds.agreement("regression", base * 1.001, base) == 1.0
    flipped = base.copy()
    flipped[:10] = -flipped[:10]
    assert output_kinds.agreement("embedding", flipped, base) == pytest.approx(0.9)
    probs = 1 / (1 + np.exp(-base))
    moved = probs.copy()
    moved[:25, 0] = np.where(moved[:25, 0] >= 0.5, 0.1, 0.9)  # one label crosses in 25 samples
    assert output_kinds.agreement("multilabel", moved, probs) == pytest.approx(0.75)


def test_an_int8_embedding_is_judged_by_cosine_similarity(store: Settings, tmp_path: Path) -> None:
    symbol, params, _ = _export(tmp_path, "emb8", _embedder())
    model = add_exported(store, "kinds-emb8", symbol, params, SHAPE, outputs="embedding")
    # labels that are no classes of a 128-d embedding: no accuracy is measured on them
    labels = np.random.default_rng(1).integers(0, 500, 512).astype(np.int32)
    built = build_variant(store, model, "int8", Calibration(_samples(512, 1), labels, "gen.npy"))
    int8 = built["variants"]["int8"]
    assert "cosine" in int8["measure"] and int8["accuracy"] is None
    assert 0.0 <= int8["agreement"] <= 1.0
    from mxq.tasks.runtimes import onnx_runtime
    x = _samples(256, 2)
    ours = onnx_runtime.runner(onnx_runtime.session(Path(int8["file"]))[0])(x)
    assert model["onnx"] is not None
    theirs = onnx_runtime.runner(onnx_runtime.session(Path(model["onnx"]["file"]))[0])(x)
    assert output_kinds.agreement("embedding", ours, theirs) >= int8["agreement"] - 0.05


@pytest.mark.parametrize("engine", ["mxnet", "onnx"])
def test_an_embedding_is_stored_as_npy_and_parquet_arrays(workers: Stack, tmp_path: Path,
                                                          engine: str) -> None:
    symbol, params, net = _export(tmp_path, "emb", _embedder())
    model = _add(workers, "kinds-embedding", symbol, params, "--outputs", "embedding")
    label = f"kinds-embedding:{model['version']}"
    x = _samples(5_000)
    save_npy(workers, f"emb-{engine}.npy", x)
    expected = net(mx.nd.array(x)).asnumpy()

    npy = infer_and_wait(workers, label, f"emb-{engine}.npy", "--output", "npy", "--engine", engine,
                         "--batch-size", "512", "--device", "cpu:0")
    assert npy["status"] == "succeeded", npy["error"]
    np.testing.assert_allclose(np.load(npy["output"]), expected, rtol=1e-5, atol=1e-5)

    job = infer_and_wait(workers, label, f"emb-{engine}.npy", "--output", "parquet", "--engine",
                         engine, "--batch-size", "512", "--device", "cpu:1")
    assert job["status"] == "succeeded", job["error"]
    table = pq.read_table(job["output"])
    assert table.column_names == ["index", "output"]
    kind = table.schema.field("output").type
    assert pa.types.is_fixed_size_list(kind) and kind.list_size == 128
    assert kind.value_type == pa.float32()
    assert table.column("index").to_pylist() == list(range(5_000))
    stored = np.stack(table.column("output").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(stored, expected, rtol=1e-5, atol=1e-5)
    row = duckdb.sql(f"SELECT output FROM '{job['output']}' WHERE \"index\" = 4321").fetchone()
    assert row is not None
    np.testing.assert_allclose(np.array(row[0]), expected[4321], rtol=1e-5, atol=1e-5)
    refused = workers.mxq("results", str(job["id"]))
    assert refused.returncode != 0 and "read them with NumPy, pyarrow, DuckDB" in refused.stderr
    written = tmp_path / f"values-{engine}"
    shown = workers.mxq("results", str(job["id"]), "--values", "output", "--format", "npy", "--out",
                        str(written))
    assert shown.returncode == 0, shown.stderr
    np.testing.assert_allclose(np.load(written), expected, rtol=1e-5, atol=1e-5)
    for done in (npy, job):  # what the API's /values and the client's Job.values() read
        got, total = results.values(workers.settings.database, workers.settings.home_path,
                                    workers.job(done["id"]), None, 1_000, 4_500)
        assert total == 5_000 and got.shape == (500, 128)
        np.testing.assert_allclose(got, expected[4_500:], rtol=1e-5, atol=1e-5)


def test_an_embedding_refuses_sql_rows_and_top_k_at_submit(workers: Stack, tmp_path: Path) -> None:
    symbol, params, _ = _export(tmp_path, "emb", _embedder())
    model = _add(workers, "kinds-embedding", symbol, params, "--outputs", "embedding")
    label = f"kinds-embedding:{model['version']}"
    save_npy(workers, "emb-refused.npy", _samples(10))
    for args, needle in [((), "--output db: "), (("--output", "npy", "--top-k", "3"), "--top-k 3: "),
                         (("--output", "npy", "--threshold", "0.3"), "--threshold 0.3: ")]:
        proc = workers.mxq("infer", label, "emb-refused.npy", *args)
        assert proc.returncode != 0 and needle in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_regression_values_in_a_parquet_column(workers: Stack, tmp_path: Path) -> None:
    symbol, params, net = _export(tmp_path, "reg", _regressor())
    model = _add(workers, "kinds-regression", symbol, params)
    assert model["outputs"] == "regression"
    x = _samples(3_000, 3)
    save_npy(workers, "reg.npy", x)
    job = infer_and_wait(workers, f"kinds-regression:{model['version']}", "reg.npy", "--output",
                         "parquet", "--engine", "onnx", "--device", "cpu:0")
    assert job["status"] == "succeeded", job["error"]
    table = pq.read_table(job["output"])
    assert str(table.schema.field("output").type) == "float"
    expected = net(mx.nd.array(x)).asnumpy()[:, 0]
    np.testing.assert_allclose(table.column("output").to_numpy(), expected, rtol=1e-5, atol=1e-5)
    rows = infer_and_wait(workers, f"kinds-regression:{model['version']}", "reg.npy", "--engine", "mxnet")
    assert rows["status"] == "succeeded", rows["error"]  # one value a row: SQL rows hold it
    stored = predictions.read(workers.settings.database, rows["id"])
    assert {r["predicted_class"] for r in stored} == {0}
    np.testing.assert_allclose([r["score"] for r in stored], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.both_legs
def test_multilabel_tags_at_a_threshold_as_rows_and_parquet(workers: Stack, tmp_path: Path) -> None:
    symbol, params, net = _export(tmp_path, "tags", _tagger())
    model = _add(workers, "kinds-tags", symbol, params, "--outputs", "multilabel")
    label = f"kinds-tags:{model['version']}"
    x = _samples(2_000, 4)
    save_npy(workers, "tags.npy", x)
    probs = net(mx.nd.array(x)).asnumpy()
    expected = [[int(c) for c in np.argsort(-p, kind="stable") if p[c] >= 0.4] for p in probs]
    assert any(len(e) > 1 for e in expected) and any(len(e) < 6 for e in expected)

    job = infer_and_wait(workers, label, "tags.npy", "--threshold", "0.4", "--engine", "mxnet",
                         "--device", "cpu:0")
    assert job["status"] == "succeeded", job["error"]
    rows = predictions.read(workers.settings.database, job["id"])
    assert [[c for c, _ in (r["top_k"] or [])] for r in rows] == expected
    np.testing.assert_allclose([r["score"] for r in rows], probs.max(axis=1), rtol=1e-5)

    job = infer_and_wait(workers, label, "tags.npy", "--threshold", "0.4", "--output", "parquet",
                         "--engine", "onnx", "--device", "cpu:1")
    assert job["status"] == "succeeded", job["error"]
    table = pq.read_table(job["output"])
    assert table.column_names == ["index", "output", "labels"]
    assert table.column("labels").to_pylist() == expected


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_embedding_of_200000_samples_on_both_engines_and_in_int8(workers: Stack, tmp_path: Path) -> None:
    """The issue's case at full size: a CNN without its last layer (128-d) over 200,000 samples,
    .npy and Parquet on MXNet and ONNX Runtime equal to plain MXNet within 1e-5 (pyarrow and
    DuckDB read arrays), and its int8 variant serving a job judged by cosine similarity."""
    symbol, params, net = _export(tmp_path, "emb", _embedder())
    model = _add(workers, "kinds-large", symbol, params, "--outputs", "embedding")
    label = f"kinds-large:{model['version']}"
    x = _samples(200_000, 9)
    save_npy(workers, "emb-large.npy", x)
    expected = np.concatenate([net(mx.nd.array(x[i:i + 10_000])).asnumpy()
                               for i in range(0, len(x), 10_000)])
    for engine in ("mxnet", "onnx"):
        npy = infer_and_wait(workers, label, "emb-large.npy", "--output", "npy", "--engine", engine,
                             "--batch-size", "1024")
        assert npy["status"] == "succeeded", npy["error"]
        np.testing.assert_allclose(np.load(npy["output"], mmap_mode="r"), expected, rtol=1e-5, atol=1e-5)
        job = infer_and_wait(workers, label, "emb-large.npy", "--output", "parquet", "--engine", engine,
                             "--batch-size", "1024")
        assert job["status"] == "succeeded", job["error"]
        shape = duckdb.sql(f"SELECT count(*), max(len(output)) FROM '{job['output']}'").fetchone()
        assert shape == (200_000, 128)
        for batch in pq.ParquetFile(job["output"]).iter_batches(batch_size=50_000):
            first = batch.column(0)[0].as_py()
            stored = np.stack(batch.column(1).to_numpy(zero_copy_only=False))
            np.testing.assert_allclose(stored, expected[first:first + len(stored)], rtol=1e-5, atol=1e-5)

    save_npy(workers, "emb-calibration.npy", _samples(1_000, 10))
    quantized = workers.mxq_json("models", "quantize", label, "--calibration", "emb-calibration.npy")
    assert "cosine" in quantized["measure"]
    int8 = infer_and_wait(workers, label, "emb-large.npy", "--output", "npy", "--precision", "int8",
                          "--batch-size", "1024")
    assert int8["status"] == "succeeded", int8["error"]
    reason = int8["result"]["precision_reason"]
    assert int8["result"]["precision"] == "int8" and "cosine similarity at least 0.99" in reason, reason
    served = np.load(int8["output"], mmap_mode="r")[:20_000]
    share = output_kinds.agreement("embedding", np.asarray(served), expected[:20_000])
    assert share >= quantized["agreement"] - 0.05, (share, quantized["agreement"])
