"""Out of memory through a real worker: `MXQ_WORKER_MEMORY_MB` caps the worker's host memory
(RLIMIT_DATA), so MXNet's own allocations fail ("Failed to allocate CPU Memory") as they do on a
full GPU. A batch that does not fit is halved until it does; one sample that does not fit fails
the job with a message that says so, and the worker goes on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from mxnet.base import MXNetError

from mxq.db.outputs import predictions
from mxq.tasks.runtimes.oom import is_out_of_memory
from tests.conftest import NODE, ROOT, Stack, _stack
from tests.support.inference import infer_and_wait, save_npy
from tests.support.workers import pid_of, wait_alive

pytestmark = pytest.mark.slow

# The cap leaves the worker (~0.7 GiB with MXNet, Celery and a model loaded) about 0.6 GiB for
# batches: LeNet on 1x32x32 images needs ~0.12 MiB a sample, so 8192 samples (~1 GiB) do not fit
# and half as many do; one sample of the `wide` model needs 1 GiB, beyond the cap at any size.
MEMORY_MB = 1300
WORKER = f"cpu0@{NODE}"
SAMPLES = 10_000
WIDE_COPIES = 1024  # the wide model tiles its 1x512x512 input into this many channels: 1 GiB
WIDE_SHAPE = (1, 512, 512)


@pytest.fixture(scope="module", params=["embedded", "system"])
def capped(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Its own stack and `mxq worker` with one CPU device whose worker is capped at MEMORY_MB."""
    stack_gen = _stack(request.param, tmp_path_factory.mktemp(f"oom-{request.param}"), 9)
    stack = next(stack_gen)
    stack.env.update({"MXQ_CPU_DEVICES": "1", "MXQ_WORKER_MEMORY_MB": str(MEMORY_MB)})
    log = open(stack.home / "launcher-oom.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker"], cwd=ROOT, env=stack.environ(),
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_alive(stack, WORKER, not_pid=0, timeout=120)
        yield stack
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
        next(stack_gen, None)


@pytest.fixture(scope="module")
def lenet(capped: Stack) -> str:
    proc = capped.mxq("models", "add", "lenet32", "--arch", "lenet", "--input-shape", "1,32,32")
    assert proc.returncode == 0, proc.stderr
    save_npy(capped, "digits32.npy",
          np.random.default_rng(3).normal(size=(SAMPLES, 1, 32, 32)).astype(np.float32))
    return "lenet32"


def _infer(stack: Stack, model: str, path: str, *args: str) -> dict:
    """The job on MXNet, whose allocations these tests are about. With `--engine auto` the job
    ran on whichever engine measured faster on a busy machine, and ONNX Runtime's memory use
    differs: in CI a batch of 8192 once fitted."""
    return infer_and_wait(stack, model, path, "--engine", "mxnet", *args)


def _oom_events(stack: Stack, job_id: int) -> list[dict]:
    record = stack.mxq_json("job", str(job_id))
    return [e for e in record["events"] if e["kind"] == "out-of-memory"]


def test_the_worker_runs_under_the_cap(capped: Stack) -> None:
    limits = Path(f"/proc/{pid_of(capped, WORKER)}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max data size"))
    assert line.split()[3] == str(MEMORY_MB * 2**20), line


def test_a_batch_that_does_not_fit_is_halved_until_it_does(capped: Stack, lenet: str) -> None:
    normal = _infer(capped, lenet, "digits32.npy", "--device", "cpu:0", "--batch-size", "256")
    assert normal["status"] == "succeeded", normal["error"]
    assert normal["result"]["batch_size_used"] == 256 and not _oom_events(capped, normal["id"])

    job = _infer(capped, lenet, "digits32.npy", "--device", "cpu:0", "--batch-size", "8192")
    assert job["status"] == "succeeded", job["error"]
    assert job["samples"] == SAMPLES
    used = job["result"]["batch_size_used"]
    assert job["result"]["batch_size"] == 8192 and 1 <= used < 8192
    url = capped.settings.database
    assert predictions.count(url, job["id"]) == SAMPLES
    rows, expected = predictions.read(url, job["id"]), predictions.read(url, normal["id"])
    assert [r["index"] for r in rows] == list(range(SAMPLES))
    assert [r["predicted_class"] for r in rows] == [r["predicted_class"] for r in expected]
    np.testing.assert_allclose([r["score"] for r in rows], [r["score"] for r in expected],
                               rtol=1e-4)

    events = _oom_events(capped, job["id"])
    assert events and all(e["data"]["device"] == "cpu:0" for e in events)
    assert [e["data"]["worked"] for e in events] == [False] * (len(events) - 1) + [True]
    assert [e["data"]["failed_batch_size"] for e in events] == [8192 >> i for i in range(len(events))]
    assert events[-1]["data"]["batch_size"] == used
    assert f"halved to {used}: it worked" in events[-1]["message"]
    assert capped.mxq_json("job", str(job["id"]))["result"]["batch_size_used"] == used


def test_batch_size_auto_finds_the_largest_that_fits(capped: Stack, lenet: str) -> None:
    job = _infer(capped, lenet, "digits32.npy", "--device", "cpu:0", "--batch-size", "auto")
    assert job["status"] == "succeeded", job["error"]
    used = job["result"]["batch_size_used"]
    assert job["result"]["batch_size"] == "auto" and 1 <= used < 8192
    events = _oom_events(capped, job["id"])
    assert [e["data"]["failed_batch_size"] for e in events] == [8192 >> i for i in range(len(events))]
    assert events[-1]["data"]["worked"] and events[-1]["data"]["batch_size"] == used
    assert predictions.count(capped.settings.database, job["id"]) == SAMPLES


def _wide_model(capped: Stack, folder: Path) -> str:
    """Tiles its input WIDE_COPIES times, pools, classifies: tiny weights, a huge activation."""
    import mxnet as mx
    from mxnet.gluon import nn

    net = nn.HybridSequential()
    net.add(nn.HybridLambda(lambda F, x: F.tile(x, reps=(1, WIDE_COPIES, 1, 1))),
            nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(10))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 1, 8, 8)))
    net.export(str(folder / "wide"), 0)
    proc = capped.mxq("models", "add", "wide", "--symbol", str(folder / "wide-symbol.json"),
                      "--params", str(folder / "wide-0000.params"),
                      "--input-shape", ",".join(map(str, WIDE_SHAPE)))
    assert proc.returncode == 0, proc.stderr
    return "wide"


def test_a_sample_that_does_not_fit_at_the_floor_fails_and_the_worker_goes_on(
        capped: Stack, lenet: str, tmp_path: Path) -> None:
    wide = _wide_model(capped, tmp_path)
    save_npy(capped, "wide.npy", np.ones((3, *WIDE_SHAPE), np.float32))
    pid = pid_of(capped, WORKER)

    job = _infer(capped, wide, "wide.npy", "--device", "cpu:0", "--batch-size", "2")
    assert job["status"] == "failed"
    assert job["error"] == "out of memory at batch size 1 on cpu:0 (started at 2; the floor is 1)"
    events = _oom_events(capped, job["id"])
    assert [(e["data"]["failed_batch_size"], e["data"]["batch_size"], e["data"]["worked"])
            for e in events] == [(2, 1, False)]
    assert predictions.count(capped.settings.database, job["id"]) == 0

    save_npy(capped, "few32.npy", np.ones((100, 1, 32, 32), np.float32))
    after = _infer(capped, lenet, "few32.npy", "--device", "cpu:0", "--batch-size", "64")
    assert after["status"] == "succeeded", after["error"]
    assert after["worker"] == WORKER and pid_of(capped, WORKER) == pid  # the same process went on
    assert predictions.count(capped.settings.database, after["id"]) == 100


def test_out_of_memory_messages() -> None:
    cpu = MXNetError('Traceback (most recent call last):\n  File "../src/storage/./cpu_device_'
                     'storage.h", line 74\nMXNetError: Failed to allocate CPU Memory')
    gpu = MXNetError("[18:53:03] src/storage/./pooled_storage_manager.h:157: cudaMalloc failed: "
                     "out of memory")
    assert is_out_of_memory(cpu) and is_out_of_memory(gpu) and is_out_of_memory(MemoryError())
    shape = MXNetError("Error in operator dense0_fwd: Shape inconsistent, Provided = [128,12800]")
    assert not is_out_of_memory(shape) and not is_out_of_memory(ValueError("bad input"))
