"""A 1-million-sample job with Parquet output, read back by pyarrow and DuckDB, and the peak
memory of the worker that ran it against the same job with SQL output, each on a fresh worker."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from mxq.db import predictions
from tests.faults.stacks import FaultStack, report

pytestmark = pytest.mark.slow

SAMPLES = 1_000_000
DEVICE = "cpu:0"


def _peak_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _fresh_worker(stack: FaultStack) -> tuple[str, int]:
    """SIGKILL the device's worker and wait for the launcher's new one: its memory starts clean."""
    name = next(d["worker"] for d in stack.mxq_json("devices") if d["device"] == DEVICE)
    old = stack.worker_pid(name)
    assert stack.kill_worker(name)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pid = stack.worker_pid(name)
        alive = [d for d in stack.mxq_json("devices") if d["device"] == DEVICE and d["alive"]]
        if pid is not None and pid != old and alive:
            return name, pid
        time.sleep(0.2)
    raise AssertionError(f"{name} was not restarted")


@pytest.mark.timeout(900)
def test_a_million_samples_to_parquet_in_no_more_memory_than_to_sql(faulty: FaultStack) -> None:
    faulty.model()
    faulty.samples("million.npy", SAMPLES, seed=5)
    peaks, jobs = {}, {}
    for output in ("db", "parquet"):
        _, pid = _fresh_worker(faulty)
        job_id = faulty.infer("mlp64", "million.npy", DEVICE, output=output, engine="onnx",
                              batch_size=1024)
        jobs[output] = faulty.wait_all([job_id], 600)[job_id]
        assert jobs[output]["status"] == "succeeded", jobs[output]["error"]
        assert jobs[output]["attempts"] == 1
        peaks[output] = _peak_mib(pid)

    path = Path(jobs["parquet"]["output"])
    table = pq.read_table(path)
    assert table.num_rows == SAMPLES and pq.ParquetFile(path).metadata.num_row_groups > 1
    index, stored = faulty.predicted(jobs["db"]["id"])
    assert np.array_equal(index, np.arange(SAMPLES))
    assert np.array_equal(table.column("index").to_numpy(), np.arange(SAMPLES))
    assert np.array_equal(table.column("predicted_class").to_numpy(), stored)
    some = predictions.read(faulty.settings.database, jobs["db"]["id"], 1000, 500_000)
    np.testing.assert_allclose(table.column("score").to_numpy()[500_000:501_000],
                               [r["score"] for r in some], rtol=1e-6)
    count, distinct, top = duckdb.sql(
        f"SELECT count(*), count(DISTINCT \"index\"), max(\"index\") FROM '{path}'").fetchone()
    assert (count, distinct, top) == (SAMPLES, SAMPLES, SAMPLES - 1)
    by_class = dict(duckdb.sql(f"SELECT predicted_class, count(*) FROM '{path}' GROUP BY 1").fetchall())
    assert by_class == {int(c): int(n) for c, n in zip(*np.unique(stored, return_counts=True), strict=True)}

    assert peaks["parquet"] <= peaks["db"], peaks
    report("1M samples: Parquet vs SQL output", {
        "backend": faulty.name, "samples": SAMPLES, "parquet_mb": round(path.stat().st_size / 2**20, 1),
        "row_groups": pq.ParquetFile(path).metadata.num_row_groups,
        "peak_worker_mib": {k: round(v) for k, v in peaks.items()},
        "samples_per_sec": {k: round(j["samples_per_sec"]) for k, j in jobs.items()}})
