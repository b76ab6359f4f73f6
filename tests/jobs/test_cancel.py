"""Cancellation through real workers: queued, running inference, running training."""

from __future__ import annotations

import numpy as np
import pytest

from mxq.db.fleet import forget, register
from mxq.db.outputs import predictions
from mxq.workers.jobs.submit import submit
from tests.conftest import NODE, Stack, wait_until


def _free(devices: list[dict]) -> bool:
    live = [d for d in devices if d["device"] in ("cpu:0", "cpu:1")]
    return all(d["alive"] and d["current_job"] is None and d["leased_by"] is None for d in live)


def _devices_free(stack: Stack) -> None:
    wait_until(lambda: stack.mxq_json("devices"), 60, "cpu:0 and cpu:1 to be alive and free",
               until=_free, interval=0.2)


def test_a_queued_job_is_cancelled_at_once(workers: Stack, mlp: dict) -> None:
    s = workers.settings
    register(s.database, f"cpu7@{NODE}", NODE, "cpu:7", f"{NODE}.cpu.7", None, {}, alive=False)
    np.save(workers.home / "data" / "queued.npy", np.ones((10, 64), np.float32))
    try:
        job_id = submit(s, "infer", {"model": "mlp64", "input": "queued.npy"}, "cpu:7",
                        allow_offline=True)
    finally:
        forget(s.database, f"cpu7@{NODE}")  # no other test should see this device
    out = workers.mxq("cancel", str(job_id), "--json")
    assert out.returncode == 0, out.stderr
    record = workers.mxq_json("job", str(job_id))
    assert record["status"] == "cancelled" and record["attempts"] == 0


@pytest.mark.both_legs  # the rows written before the cancel are committed
# One sample a batch on both engines: the job lasts many progress writes (each answers the cancel
# check, every 2 s) on any machine; at 16 a batch a quiet machine once finished the rest of the
# job between the write that showed 2 % and the next one, so the cancel never landed.
# The MXNet case in the slow tier: the fast one cancels through the same frame on ONNX Runtime.
@pytest.mark.parametrize(("engine", "batch"), [pytest.param("mxnet", 1, marks=pytest.mark.slow),
                                               ("onnx", 1)])
def test_a_running_inference_stops_and_keeps_its_rows(workers: Stack, mlp: dict, engine: str,
                                                      batch: int) -> None:
    s = workers.settings
    # small batches over many samples: seconds, so the (in-process) cancel lands mid-run; ONNX
    # Runtime ran 200,000 of them in under 3 s once reads held many batches, barely past the check
    n = 800_000
    np.save(workers.home / "data" / "long.npy", np.ones((n, 64), np.float32))
    job_id = submit(s, "infer", {"model": "mlp64", "input": "long.npy", "batch_size": batch,
                                 "engine": engine}, "cpu:0")
    wait_until(lambda: workers.job(job_id), 120, f"job {job_id} to reach 2% progress",
               until=lambda record: (record["progress"] or 0) >= 0.02, interval=0.05)
    assert workers.mxq("cancel", str(job_id)).returncode == 0
    done = workers.wait(job_id, timeout=120)
    assert done["status"] == "cancelled" and "partial results kept" in (done["error"] or "")
    kept = predictions.count(s.database, job_id)
    assert 0 < kept < n and kept == done["samples"]
    rows = predictions.read(s.database, job_id)
    assert [r["index"] for r in rows] == list(range(kept))  # a prefix, no gaps
    _devices_free(workers)


def test_a_running_training_stops_at_an_epoch_and_frees_its_devices(workers: Stack) -> None:
    s = workers.settings
    job_id = submit(s, "train", {"arch": "mlp", "dataset": "digits", "name": "cancelled",
                                 "devices": 2, "epochs": 500, "val_fraction": 0.1}, "auto")
    wait_until(lambda: workers.mxq_json("job", str(job_id)), 120,
               f"job {job_id} to record 2 epochs",
               until=lambda record: len(record.get("epochs") or []) >= 2)
    assert workers.mxq("cancel", str(job_id)).returncode == 0
    done = workers.wait(job_id, timeout=120)
    assert done["status"] == "cancelled"
    epochs = workers.mxq_json("job", str(job_id))["epochs"]
    assert 2 <= len(epochs) < 500 and all(e["checkpoint"] for e in epochs)
    assert workers.mxq("models", "cancelled").returncode == 2  # nothing registered
    _devices_free(workers)
