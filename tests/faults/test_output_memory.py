"""A 1-million-sample job with Parquet output, read back by pyarrow and DuckDB, and the memory
the worker took for it against the same job with SQL output: its peak resident memory during the
job (VmHWM, reset when the job starts) above what it held before."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from mxq.db.outputs import predictions
from mxq.json_types import JsonObject
from mxq.tasks.inference.inputs import npy
from tests.faults.stacks import FaultStack, report

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

pytestmark = pytest.mark.slow

SAMPLES = 1_000_000
DEVICE = "cpu:0"


def _memory_mib(pid: int, field: str) -> float:
    """VmRSS (resident now) or VmHWM (peak since the last reset) of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def _reset_peak(pid: int) -> float:
    """Start the peak over from now (Linux: clear_refs 5); what the process holds now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _memory_mib(pid, "VmRSS")


def _worker_pid(stack: FaultStack) -> int:
    name = next(d["worker"] for d in stack.mxq_json("devices") if d["device"] == DEVICE)
    pid = stack.worker_pid(name)
    assert pid is not None
    return pid


@pytest.mark.timeout(900)
def test_a_million_samples_to_parquet_in_no_more_memory_than_to_sql(faulty: FaultStack) -> None:
    faulty.model()
    faulty.samples("million.npy", SAMPLES, seed=5)
    faulty.samples("warm.npy", 5000, seed=6)
    params: JsonObject = {"engine": "onnx", "batch_size": 1024}
    growth: dict[str, list[float]] = {}
    jobs: dict[str, JobRecord] = {}
    for output in ("db", "parquet", "db", "parquet"):  # twice each, interleaved
        warm = faulty.infer("mlp64", "warm.npy", DEVICE, output=output, **params)
        assert faulty.wait_all([warm], 300)[warm]["status"] == "succeeded"  # model and session loaded
        pid = _worker_pid(faulty)
        before = _reset_peak(pid)
        job_id = faulty.infer("mlp64", "million.npy", DEVICE, output=output, **params)
        jobs[output] = faulty.wait_all([job_id], 600)[job_id]
        assert jobs[output]["status"] == "succeeded", jobs[output]["error"]
        assert jobs[output]["attempts"] == 1 and _worker_pid(faulty) == pid
        growth.setdefault(output, []).append(_memory_mib(pid, "VmHWM") - before)

    path = Path(str(jobs["parquet"]["output"]))
    table = pq.read_table(path)
    assert table.num_rows == SAMPLES and pq.ParquetFile(path).metadata.num_row_groups > 1
    index, stored = faulty.predicted(jobs["db"]["id"])
    assert np.array_equal(index, np.arange(SAMPLES))
    assert np.array_equal(table.column("index").to_numpy(), np.arange(SAMPLES))
    assert np.array_equal(table.column("predicted_class").to_numpy(), stored)
    some = predictions.read(faulty.settings.database, jobs["db"]["id"], 1000, 500_000)
    np.testing.assert_allclose(table.column("score").to_numpy()[500_000:501_000],
                               [r["score"] for r in some], rtol=1e-6)
    assert duckdb.sql(f"SELECT count(*), count(DISTINCT \"index\"), max(\"index\") FROM '{path}'"
                      ).fetchone() == (SAMPLES, SAMPLES, SAMPLES - 1)
    by_class = dict(duckdb.sql(f"SELECT predicted_class, count(*) FROM '{path}' GROUP BY 1").fetchall())
    assert by_class == {int(c): int(n) for c, n in zip(*np.unique(stored, return_counts=True), strict=True)}

    # Both stream: a job holds a flush or two, never its million results (16 MiB as Arrow
    # columns, about 150 MiB as Python rows), beside the input's pages it reads in place (at
    # most KEEP_MAPPED_BYTES + DROP_STEP_BYTES mapped). Each kind's first job in a worker also
    # grows the allocator's pools, so the rounds are compared as sums.
    bound = 48 + (npy.KEEP_MAPPED_BYTES + npy.DROP_STEP_BYTES) / 2**20
    assert max(growth["parquet"] + growth["db"]) < bound, growth
    assert sum(growth["parquet"]) <= sum(growth["db"]), growth
    report("1M samples: Parquet vs SQL output", {
        "backend": faulty.name, "samples": SAMPLES, "parquet_mb": round(path.stat().st_size / 2**20, 1),
        "row_groups": pq.ParquetFile(path).metadata.num_row_groups,
        "worker_peak_growth_mib": {k: [round(v, 1) for v in vs] for k, vs in growth.items()},
        "samples_per_sec": {k: round(j["samples_per_sec"] or 0) for k, j in jobs.items()}})
