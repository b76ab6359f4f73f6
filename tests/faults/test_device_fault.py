"""A device that fails mid-job takes itself out, not the job (issue 45), with real workers: a
GPU cannot exist here, so a `sitecustomize` makes one CPU worker's MXNet raise the error a GPU
that faults mid-job raises (`MXNetError: … CUDA: uncorrectable ECC error encountered`),
once, after some batches; the other device finishes the job."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxq.db import jobs
from mxq.db.events import list_events
from mxq.db.fleet import list_workers
from mxq.db.outputs import predictions
from mxq.workers.jobs.submit import submit, submit_many
from tests.conftest import NODE, Stack, launch, stop, wait_until

pytestmark = pytest.mark.slow

SAMPLES, BATCH = 120_000, 128
FAULT_AFTER = 200  # batches of the faulty worker before its "GPU" fails: a flush stored by then
MERGED = 40  # single-sample jobs queued together, for one lead to take into its batch

# Loaded by every Python process of the stack that has PYTHONPATH; acts only in a device worker
# while the marker file exists, and in the first worker to take it (an atomic rename).
SITECUSTOMIZE = '''
import os
marker = os.environ.get("MXQ_TEST_FAULT_MARKER", "")
if marker and os.environ.get("MXQ_DEVICE"):
    from mxq.tasks.model_store import models
    from mxq.tasks.runtimes.mx import mx

    real, calls = models.probabilities, [0]

    def probabilities(*args, **kwargs):
        calls[0] += 1
        if FAULT(calls[0], args):
            try:
                os.rename(marker, marker + "." + os.environ["MXQ_DEVICE"].replace(":", ""))
            except OSError:
                pass  # another worker took the fault
            else:
                raise mx.base.MXNetError(
                    "[12:00:00] src/storage/storage.cc:123: Check failed: e == cudaSuccess "
                    "(214 vs. 0) : CUDA: uncorrectable ECC error encountered")
        return real(*args, **kwargs)

    models.probabilities = probabilities
'''


def _faulty_environment(tmp: Path, when: str = f"calls == {FAULT_AFTER}") -> dict[str, str]:
    """`when`: on which call of `probabilities(net, ctx, x, outputs)` (its number `calls`, its
    `args`) the first worker to reach it faults."""
    (tmp / "site").mkdir()
    (tmp / "site" / "sitecustomize.py").write_text(f"def FAULT(calls, args):\n    return {when}\n"
                                                   + SITECUSTOMIZE)
    marker = tmp / "fault"
    marker.write_text("the first worker to meet FAULT faults once")
    return {"PYTHONPATH": str(tmp / "site"), "MXQ_TEST_FAULT_MARKER": str(marker),
            "MXQ_REPROBE_SECONDS": "3"}


def add_mlp(stack: Stack) -> None:
    """The built-in MLP the tests run, registered as `mlp64` (64 inputs, 10 classes)."""
    add = stack.mxq("models", "add", "mlp64", "--arch", "mlp", "--input-shape", "64", "--classes", "10")
    assert add.returncode == 0, add.stderr


def mlp_and_input(stack: Stack, name: str, seed: int, samples: int) -> None:
    """`add_mlp`, and `samples` seeded inputs for it saved as data/NAME."""
    add_mlp(stack)
    np.save(stack.home / "data" / name,
            np.random.default_rng(seed).standard_normal((samples, 64), dtype=np.float32))


def stored_rows(stack: Stack, job_id: int) -> np.ndarray:
    """The sample index of every prediction row of the job, sorted (duplicates kept)."""
    return np.sort(np.array([r["index"] for r in predictions.read(stack.settings.database, job_id)]))


def _worker_row(stack: Stack, device: str) -> dict:
    rows = list_workers(stack.settings.database, 5.0, NODE)
    return next(dict(r) for r in rows if r["device"] == device)


@pytest.mark.timeout(600)
def test_a_device_fault_mid_job_requeues_the_job_to_a_healthy_device_and_takes_the_device_out(
        isolated: Stack, tmp_path: Path) -> None:
    """Without the device-fault path the job failed ("MXNetError: … CUDA: …") as the user's, and
    the worker took the next job on the broken device."""
    env = _faulty_environment(tmp_path)
    launcher = launch(isolated, **env)
    try:
        mlp_and_input(isolated, "fault.npy", 5, SAMPLES)
        sent = isolated.mxq_json("infer", "mlp64", "fault.npy", "--engine", "mxnet",
                                 "--precision", "fp32", "--batch-size", str(BATCH))
        job = isolated.wait(sent["id"], timeout=300)
        assert job["status"] == "succeeded", job["error"]
        faulted = [p.name.rsplit(".", 1)[1] for p in tmp_path.glob("fault.cpu*")]
        assert len(faulted) == 1, "no worker faulted: the test did not test"
        out = f"cpu:{faulted[0].removeprefix('cpu')}"
        assert job["device_faults"] == 1 and job["attempts"] == 1, job
        assert job["device"] != out, f"the job ended on the device that failed ({out})"
        said = [e for e in list_events(isolated.settings.database, job["id"])
                if e["kind"] == "device-fault"]
        assert len(said) == 1 and said[0]["message"].startswith(
            f"device fault on {out} during job {job['id']}: "), said
        assert "CUDA: uncorrectable ECC error encountered" in said[0]["message"]

        assert np.array_equal(stored_rows(isolated, job["id"]), np.arange(SAMPLES)), \
            "a row lost or stored twice"

        # The device was out (its worker row said why) and, passing its probe, is back.
        row = wait_until(lambda: _worker_row(isolated, out), 120, f"{out}'s worker to come back",
                         until=lambda r: r["alive"], interval=0.5)
        log = (isolated.home / "logs" / f"cpu{out[-1]}-{NODE}.log").read_text(errors="replace")
        assert f"device fault on {out} during job {job['id']}" in log
        assert row["alive"]
        again = isolated.mxq_json("infer", "mlp64", "fault.npy", "--device", out, "--engine",
                                  "mxnet", "--batch-size", str(BATCH))
        assert isolated.wait(again["id"], timeout=300)["status"] == "succeeded"
    finally:
        stop(launcher)


@pytest.mark.timeout(600)
def test_a_device_fault_under_a_merged_batch_sends_every_member_back_without_an_attempt(
        isolated: Stack, tmp_path: Path) -> None:
    """Dynamic batching: the jobs a lead took into its batch stayed `running` on the worker that
    left, until the reconciler charged each an attempt; each goes back as the lead does."""
    env = _faulty_environment(tmp_path, when="len(args[2]) > 1")  # a merged batch's forward pass
    launcher = launch(isolated, **env)
    try:
        s = isolated.settings
        add_mlp(isolated)
        x = np.random.default_rng(6).standard_normal((MERGED, 64), dtype=np.float32)
        (isolated.home / "data" / "one").mkdir()
        for i in range(MERGED):
            np.save(isolated.home / "data" / "one" / f"{i}.npy", x[i:i + 1])
        hold = submit(s, "probe", {"size": 512, "batch": 8, "repeat": 10_000}, "cpu:0")
        isolated.wait(hold, until=("running",))  # every message queued before one is taken
        params = [{"model": "mlp64", "input": f"one/{i}.npy", "engine": "mxnet", "precision": "fp32"}
                  for i in range(MERGED)]
        ids = submit_many(s, "infer", params, "cpu:0")
        jobs.cancel(s.database, hold)
        done = [isolated.wait(i, timeout=300) for i in ids]
        assert list(tmp_path.glob("fault.cpu*")), "no merged batch faulted: the test did not test"
        assert all(j["status"] == "succeeded" for j in done), [j["error"] for j in done]
        handed_back = [j for j in done if j["device_faults"] == 1]
        assert len(handed_back) > 1, "the fault hit no merged batch"
        assert all(j["attempts"] == 1 for j in done), [(j["id"], j["attempts"]) for j in done]
        for job_id in ids:
            assert np.array_equal(stored_rows(isolated, job_id), np.arange(1)), job_id
    finally:
        stop(launcher)
