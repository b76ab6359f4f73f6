"""A 512 MB .npy object scored from the bucket in bounded memory: the worker's peak resident
memory during the job (VmHWM, reset when the job starts) grows no more than for the same file
read from local disk (memory-mapped a batch at a time), far below the object's size; the
predictions are the same.

512 MB, not several GB: moto's server reads (and copies) a whole object for every ranged GET, so
each 8 MiB block of a 2 GB object cost it 2 GB of copying, minutes per pass. The bound tested
does not depend on the size: the worker holds three blocks whatever the object."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import Stack
from tests.faults.test_output_memory import _memory_mib, _reset_peak
from tests.support.inference import infer_and_wait
from tests.support.s3 import BUCKET, S3Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SAMPLES = 2_000_000  # of 64 float32: 512 MB
BLOCKS_AND_BUFFERS_MIB = 64  # what reading by ranges may hold beyond a local read: 3 blocks of 8 MiB


def _write(path: Path) -> None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(SAMPLES, 64))
    rng = np.random.default_rng(11)
    for i in range(0, SAMPLES, 500_000):
        out[i:i + 500_000] = rng.normal(size=(min(500_000, SAMPLES - i), 64)).astype(np.float32)
    out.flush()
    del out


def _worker_pid(stack: Stack) -> int:
    from mxq.db.fleet import list_workers

    s = stack.settings
    pid = next(w["pid"] for w in list_workers(s.database, s.heartbeat_ttl, s.node) if w["device"] == "cpu:0")
    assert pid is not None
    return int(pid)


def test_a_half_gigabyte_object_is_scored_in_bounded_memory(workers: Stack, mlp: dict) -> None:
    s3 = S3Server.shared()
    local = workers.home / "data" / "half-gb.npy"
    _write(local)
    try:
        s3.client().upload_file(str(local), BUCKET, "in/half-gb.npy")
        small = np.zeros((4096, 64), dtype=np.float32)
        np.save(workers.home / "data" / "half-gb-warm.npy", small)
        buf = io.BytesIO()
        np.save(buf, small)
        s3.put("in/half-gb-warm.npy", buf.getvalue())
        growth: dict[str, float] = {}
        classes: dict[str, np.ndarray] = {}
        params = ("--device", "cpu:0", "--engine", "onnx", "--batch-size", "4096", "--output", "parquet")
        for name, source, warm_source in (
                ("local", "half-gb.npy", "half-gb-warm.npy"),
                ("s3", f"s3://{BUCKET}/in/half-gb.npy", f"s3://{BUCKET}/in/half-gb-warm.npy")):
            warm = infer_and_wait(workers, "mlp64", warm_source, *params)
            assert warm["status"] == "succeeded", warm["error"]  # the session and the client made
            pid = _worker_pid(workers)
            before = _reset_peak(pid)
            job = infer_and_wait(workers, "mlp64", source, *params)
            assert job["status"] == "succeeded", job["error"]
            growth[name] = _memory_mib(pid, "VmHWM") - before
            classes[name] = pq.read_table(job["output"], columns=["predicted_class"]).column(0).to_numpy()
        assert np.array_equal(classes["s3"], classes["local"]) and len(classes["s3"]) == SAMPLES
        assert growth["s3"] <= growth["local"] + BLOCKS_AND_BUFFERS_MIB, growth
        assert growth["s3"] < local.stat().st_size / 2**20 / 8, growth  # never the object whole
    finally:
        local.unlink(missing_ok=True)
        s3.client().delete_object(Bucket=BUCKET, Key="in/half-gb.npy")
