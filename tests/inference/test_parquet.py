"""Parquet output: written by real workers as the job streams, read back by pyarrow and DuckDB;
any job's stored predictions exported with `mxq results --format parquet`; the part files'
merge rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from mxq.db.outputs import parquet, predictions, results
from mxq.db.outputs.results import recorded_output
from mxq.db.records import PredictionRow
from mxq.db.stack import stack_id
from tests.conftest import Stack
from tests.support.inference import infer_and_wait, predict_directly, save_npy

if TYPE_CHECKING:
    from mxq.db.records import JobRecord


def _expected(stack: Stack, x: np.ndarray) -> np.ndarray:
    return predict_directly(stack, "mlp64", x)


def test_parquet_output_read_by_pyarrow_and_duckdb(workers: Stack, mlp: dict, tmp_path: Path) -> None:
    x = np.random.default_rng(3).normal(size=(30_000, 64)).astype(np.float32)
    save_npy(workers, "pq.npy", x)
    job = infer_and_wait(workers, "mlp64", "pq.npy", "--output", "parquet", "--top-k", "3",
                 "--batch-size", "512", "--device", "cpu:0")
    assert job["status"] == "succeeded", job["error"]
    path = Path(job["output"])
    assert path.name == f"job-{job['id']}.parquet" and path.exists()
    assert not parquet.parts_dir(path).exists()  # the parts were merged and removed
    assert predictions.count(workers.settings.database, job["id"]) == 0  # no rows in SQL

    table = pq.read_table(path)
    assert table.column_names == ["index", "predicted_class", "score", "top_k_classes", "top_k_scores"]
    expected = _expected(workers, x)
    assert table.column("index").to_pylist() == list(range(30_000))
    assert np.array_equal(table.column("predicted_class").to_numpy(), expected.argmax(axis=1))
    np.testing.assert_allclose(table.column("score").to_numpy(), expected.max(axis=1), rtol=1e-5)
    assert table.column("top_k_classes")[11].as_py() == np.argsort(-expected[11])[:3].tolist()

    assert duckdb.sql(f"SELECT count(*), count(DISTINCT \"index\") FROM '{path}'").fetchone() == \
        (30_000, 30_000)
    best = duckdb.sql(f"SELECT predicted_class FROM '{path}' WHERE \"index\" = 123").fetchone()
    assert best == (int(expected[123].argmax()),)

    shown = json.loads(workers.mxq("results", str(job["id"]), "--format", "json", "--limit", "3",
                                   "--offset", "29998").stdout)
    assert [r["index"] for r in shown] == [29998, 29999]
    assert shown[0]["top_k"][0][0] == int(expected[29998].argmax())

    exported = tmp_path / "slice.parquet"  # a Parquet job's export is a slice of its file
    proc = workers.mxq("results", str(job["id"]), "--format", "parquet", "--out", str(exported),
                       "--offset", "100", "--limit", "5000")
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(exported).to_pydict() == table.slice(100, 5000).to_pydict()


def test_chunked_parquet_job_merges_into_one_file(workers: Stack, mlp: dict) -> None:
    x = np.random.default_rng(4).normal(size=(5000, 64)).astype(np.float32)
    save_npy(workers, "pq-chunks.npy", x)
    job = infer_and_wait(workers, "mlp64", "pq-chunks.npy", "--output", "parquet", "--chunk-size", "1200")
    assert job["status"] == "succeeded", job["error"]
    record = cast("JobRecord", job)  # what `--json` printed is the job's record
    path = recorded_output(workers.settings.home_path, workers.settings.database, record, ".parquet")
    assert path.parent.name == stack_id(workers.settings.database)  # keyed by the database
    table = pq.read_table(path)
    assert table.column("index").to_pylist() == list(range(5000))
    assert np.array_equal(table.column("predicted_class").to_numpy(),
                          _expected(workers, x).argmax(axis=1))


def test_results_exports_sql_rows_as_parquet(workers: Stack, mlp: dict, tmp_path: Path) -> None:
    x = np.random.default_rng(5).normal(size=(700, 64)).astype(np.float32)
    save_npy(workers, "pq-export.npy", x)
    job = infer_and_wait(workers, "mlp64", "pq-export.npy", "--top-k", "2")
    out = tmp_path / "export.parquet"
    proc = workers.mxq("results", str(job["id"]), "--format", "parquet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 700 predictions of job {job['id']}" in proc.stderr
    table = pq.read_table(out)
    rows = predictions.read(workers.settings.database, job["id"])
    assert table.column("predicted_class").to_pylist() == [r["predicted_class"] for r in rows]
    assert table.column("top_k_classes").to_pylist() == [[c for c, _ in r["top_k"] or []] for r in rows]
    assert all(r["top_k"] for r in rows)
    np.testing.assert_allclose(table.column("score").to_numpy(), [r["score"] for r in rows], rtol=1e-6)

    refused = workers.mxq("results", str(job["id"]), "--format", "parquet")
    assert refused.returncode == 2 and "--out FILE goes with --format parquet" in refused.stderr


def _part(final: Path, first: int, last: int, attempt: int = 1) -> Path | None:
    probs = np.random.default_rng(first).random((last - first, 4)).astype(np.float32)
    return parquet.write_part(final, [parquet.from_probabilities(first, probs, 2)], f"j1a{attempt}")


def test_parts_merge_only_when_they_tile_the_input(tmp_path: Path) -> None:
    final = tmp_path / "job-1.parquet"
    _part(final, 0, 100)
    _part(final, 200, 300)
    assert not parquet.merge_if_complete(final, 300) and not final.exists()  # [100, 200) missing
    _part(final, 100, 150)
    _part(final, 150, 200)
    _part(final, 300, 310)  # written by an attempt that died before committing it
    assert not parquet.merge_if_complete(final, 300)  # past the end: the parts do not tile it
    parquet.drop_parts(final, 200, 400)  # an attempt resuming at 200 drops what begins there
    assert not parquet.merge_if_complete(final, 300)
    _part(final, 200, 300)
    assert parquet.merge_if_complete(final, 300)
    assert pq.read_table(final).column("index").to_pylist() == list(range(300))
    assert not parquet.parts_dir(final).exists()
    assert [r["index"] for r in parquet.read_rows_of([final], 5, 148)] == [148, 149, 150, 151, 152]


def test_a_paused_attempts_part_is_never_merged(tmp_path: Path) -> None:
    """Attempt 1 was paused after writing [100, 200) but before committing it; attempt 2 resumed
    at 100 and wrote it again in two flushes. The merge takes attempt 2's parts only."""
    final = tmp_path / "job-1.parquet"
    _part(final, 0, 100, attempt=1)
    stray = _part(final, 100, 200, attempt=1)
    _part(final, 100, 150, attempt=2)
    _part(final, 150, 200, attempt=2)
    assert stray is not None and stray.name == "000000000100-000000000200.j1a1.parquet"
    assert parquet.merge_if_complete(final, 200)
    assert pq.read_table(final).column("index").to_pylist() == list(range(200))


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    final = tmp_path / "job-1.parquet"
    _part(final, 0, 100)
    gone = _part(final, 100, 200)
    _part(final, 200, 300)
    assert gone is not None
    gone.unlink()
    assert not parquet.covers(final, 0, 300) and parquet.covers(final, 200, 300)
    assert parquet.missing(parquet.part_list(final), 300) == "samples [100, 200)"


@pytest.mark.parametrize("status", ["cancelled", "failed"])
def test_a_job_stopped_before_its_merge_reads_the_parts_it_kept(tmp_path: Path, status: str) -> None:
    """Cancelled, or failed past its time limit (which keeps what it committed): its rows are
    its parts', as a cancelled job's are (any other failure removed its parts: none to read)."""
    final = tmp_path / "job-1.parquet"
    _part(final, 0, 100)
    _part(final, 100, 150)
    record = cast("JobRecord", {"id": 1, "status": status, "params": {"output": "parquet"},
                                "result": {"output": str(final)}})
    assert [r["index"] for r in results.read("sqlite://", tmp_path, record)] == list(range(150))
    assert results.count("sqlite://", tmp_path, record) == 150


@pytest.mark.parametrize("top_k", [0, 3])
def test_rows_and_probabilities_make_the_same_table(top_k: int) -> None:
    probs = np.random.default_rng(top_k).random((50, 5)).astype(np.float32)
    from_probs = parquet.from_probabilities(10, probs, top_k)
    stored: list[PredictionRow] = [
        {"index": 10 + i, "predicted_class": int(p.argmax()), "score": float(p.max()),
         "top_k": [(int(c), float(p[c])) for c in np.argsort(-p)[:top_k]] or None}
        for i, p in enumerate(probs)]
    assert parquet.from_rows(stored, top_k).equals(from_probs)
