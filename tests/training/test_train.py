"""Data-parallel training through real workers: accuracy, leases, crash and resume, registry."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxq.db.outputs import predictions
from mxq.tasks.training import datasets
from mxq.tasks.training.train_loop import fit, lr_at, make_net, make_trainer
from mxq.workers.jobs.jobspecs import ParamsError, TrainParams, validate
from mxq.workers.jobs.submit import submit
from mxq.workers.settings import Settings
from tests.conftest import Stack, wait_until
from tests.support.workers import pid_of, wait_alive

SMALL = {"size": 64, "batch": 2, "repeat": 1}


def _train(stack: Stack, *args: str) -> tuple[int, dict]:
    proc = stack.mxq("train", *args, "--wait", "--json")
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr}


def test_data_parallel_equals_one_device() -> None:
    """Same seed and global batch: one epoch on 2 devices gives the 1-device parameters."""
    train, val = datasets.split(datasets.digits().for_training(), 0.2, 0)
    p = TrainParams(arch="lenet", dataset="digits", name="x", epochs=1, batch_size=64, seed=3)

    def one_epoch(k: int) -> list[np.ndarray]:
        ctxs = [mx.cpu(i) for i in range(k)]
        net = make_net(p, train.classes, train.sample_shape, ctxs)
        fit(p, train, val, ctxs, [f"cpu:{i}" for i in range(k)], net, make_trainer(p, net, False))
        return [v.data(ctxs[-1]).asnumpy() for v in net.collect_params().values()]

    single, double = one_epoch(1), one_epoch(2)
    untrained = make_net(p, 10, (1, 8, 8), [mx.cpu()])
    untrained(mx.nd.zeros((1, 1, 8, 8)))  # shapes are inferred on the first forward pass
    start = [v.data().asnumpy() for v in untrained.collect_params().values()]
    assert any(not np.allclose(a, b) for a, b in zip(single, start, strict=True))  # it did train
    for a, b in zip(single, double, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("options", "rates"), [
    ({}, [0.1, 0.1, 0.1, 0.1, 0.1, 0.1]),
    ({"lr_schedule": "step", "lr_step": 2, "lr_factor": 0.5}, [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]),
    ({"lr_schedule": "step"}, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]),  # a step every third of 6
    ({"lr_schedule": "cosine"}, [0.1, 0.0933, 0.075, 0.05, 0.025, 0.0067]),
])
def test_the_learning_rate_by_epoch(options: dict, rates: list[float]) -> None:
    """A function of the epoch alone: a training resumed at epoch 4 goes on at epoch 4's rate."""
    p = TrainParams(arch="mlp", dataset="digits", name="x", epochs=6, lr=0.1, **options)
    assert [round(lr_at(p, e), 4) for e in range(1, 7)] == rates


def test_the_optimizer_options_reach_the_trainer_epoch_by_epoch() -> None:
    train, _ = datasets.split(datasets.digits().for_training(), 0.2, 0)
    p = TrainParams(arch="mlp", dataset="digits", name="x", epochs=3, batch_size=256, lr=0.2,
                    momentum=0.5, weight_decay=1e-4, lr_schedule="cosine")
    ctxs = [mx.cpu()]
    net = make_net(p, train.classes, train.sample_shape, ctxs)
    trainer = make_trainer(p, net, False)
    seen: list[float] = []
    fit(p, train, None, ctxs, ["cpu:0"], net, trainer, on_epoch=lambda _: seen.append(trainer.learning_rate))
    assert seen == [lr_at(p, e) for e in (1, 2, 3)] and seen[0] > seen[1] > seen[2]
    assert (trainer._optimizer.momentum, trainer._optimizer.wd) == (0.5, 1e-4)
    with pytest.raises(ParamsError, match="--momentum 0.9 goes with --optimizer sgd or nag, not adam"):
        validate("train", {"arch": "mlp", "dataset": "digits", "name": "x", "optimizer": "adam",
                           "momentum": 0.9})


def test_the_optimizer_options_are_recorded_on_the_job(workers: Stack) -> None:
    code, job = _train(workers, "mlp", "digits", "--name", "tuned", "--epochs", "2", "--momentum",
                       "0.8", "--weight-decay", "0.0001", "--lr-schedule", "step", "--lr-step", "1",
                       "--lr-factor", "0.5")
    assert code == 0 and job["status"] == "succeeded", job
    asked = {k: job["params"][k] for k in ("momentum", "weight_decay", "lr_schedule", "lr_step",
                                           "lr_factor")}
    assert asked == {"momentum": 0.8, "weight_decay": 0.0001, "lr_schedule": "step", "lr_step": 1,
                     "lr_factor": 0.5}


def test_two_devices_train_lenet_on_digits_and_the_model_serves(workers: Stack) -> None:
    code, job = _train(workers, "lenet", "digits", "--name", "digits-cnn", "--devices", "2",
                       "--epochs", "5", "--seed", "1")
    assert code == 0 and job["status"] == "succeeded", job
    assert sorted(job["devices"]) == ["cpu:0", "cpu:1"]
    assert [e["epoch"] for e in job["epochs"]] == [1, 2, 3, 4, 5]
    last = job["epochs"][-1]
    assert last["val_accuracy"] >= 0.9, job["epochs"]
    assert set(last["per_device"]) == {"cpu:0", "cpu:1"} and last["samples_per_sec"] > 0
    assert job["model_version"] == 1 and job["attempts"] == 1
    assert job["model"] == "digits-cnn"  # the dashboard's "model" of a training job
    # One throughput point per device per epoch, each device's share of the epoch's samples.
    points = job["metrics"]
    assert sorted((p["step"], p["device"]) for p in points) == \
        [(2 * e + i, d) for e in range(5) for i, d in enumerate(["cpu:0", "cpu:1"])]
    for e in job["epochs"]:
        mine = [p for p in points if p["step"] // 2 == e["epoch"] - 1]
        assert sum(p["samples"] for p in mine) == pytest.approx(e["samples_per_sec"] * e["seconds"], abs=2)
    models = workers.mxq_json("models", "digits-cnn")
    assert models[0]["metrics"]["val_accuracy"] == last["val_accuracy"]
    assert models[0]["source"] == f"train:job-{job['id']}"
    assert models[0]["preprocess"]["scale"] == 1 / 16  # what it trained with: served raw digits
    digits = datasets.digits()
    np.save(workers.home / "data" / "digits.npy", digits.x)
    served = workers.mxq_json("infer", "digits-cnn", "digits.npy", "--wait")
    assert served["status"] == "succeeded" and served["model_version"] == 1
    rows = predictions.read(workers.settings.database, served["id"])
    accuracy = np.mean(np.array([r["predicted_class"] for r in rows]) == digits.y)
    assert accuracy >= 0.9


@pytest.mark.slow  # seconds of real training on a worker: make test-all (CI) runs it
def test_a_training_past_its_time_limit_stops_at_a_batch(workers: Stack) -> None:
    """A limit of 1 s counts from the claim, so the training child's start runs past it: the
    training stops at its first batch (it ran its whole first epoch when the limit was checked
    once per epoch), registers nothing, and fails naming the limit and where it stopped."""
    code, job = _train(workers, "lenet", "digits", "--name", "limited", "--epochs", "10",
                       "--batch-size", "16", "--time-limit", "1")
    assert code == 1 and job["status"] == "failed", job
    assert re.fullmatch(r"time limit 1s reached after \d+ s: stopped in epoch 1 of 10 \(the "
                        r"checkpoints of its finished epochs are kept\)", job["error"] or ""), job["error"]
    assert job["epochs"] == []
    assert job["model_version"] is None
    assert "limited" not in {m["name"] for m in workers.mxq_json("models")}


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_training_without_validation_registers_a_servable_model(workers: Stack) -> None:
    """No validation pass means the net never ran outside the training graph: the export must
    still find its compiled graph."""
    code, job = _train(workers, "mlp", "digits", "--name", "no-val", "--epochs", "2",
                       "--val-fraction", "0")
    assert code == 0 and job["status"] == "succeeded", job
    assert job["epochs"][-1]["val_accuracy"] is None and job["epochs"][-1]["train_accuracy"] > 0.5
    np.save(workers.home / "data" / "digits-no-val.npy", datasets.digits().x[:50])
    served = workers.mxq_json("infer", "no-val", "digits-no-val.npy", "--wait")
    assert served["status"] == "succeeded" and served["model_version"] == job["model_version"]


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_a_probe_sent_to_a_leased_device_waits_for_the_training(workers: Stack) -> None:
    s = workers.settings
    train_id = submit(s, "train", {"arch": "mlp", "dataset": "digits", "name": "long",
                                   "devices": 2, "epochs": 60, "val_fraction": 0.1}, "auto")
    workers.wait(train_id, until=("running",))
    wait_until(lambda: workers.mxq_json("devices"), 60,
               f"every live device to be leased by job {train_id}",
               until=lambda devices: {d["leased_by"] for d in devices if d["alive"]} == {train_id})
    probe_id = submit(s, "probe", dict(SMALL), "cpu:0")
    trained, probed = workers.wait(train_id, timeout=600), workers.wait(probe_id, timeout=600)
    assert trained["status"] == probed["status"] == "succeeded", trained["error"]
    assert probed["started_at"] and trained["finished_at"]
    assert probed["started_at"] >= trained["finished_at"]
    assert probed["attempts"] == 1


@pytest.mark.slow
def test_killed_training_worker_resumes_from_its_checkpoint(workers: Stack) -> None:
    s = workers.settings
    job_id = submit(s, "train", {"arch": "mlp", "dataset": "digits", "name": "resumed",
                                 "devices": 2, "epochs": 40, "val_fraction": 0.1}, "auto")
    wait_until(lambda: workers.mxq_json("job", str(job_id)), 300,
               f"job {job_id} to record 3 epochs",
               until=lambda record: len(record.get("epochs") or []) >= 3)
    leader = workers.job(job_id)["worker"]
    pid = pid_of(workers, leader)
    os.kill(pid, signal.SIGKILL)
    wait_alive(workers, leader, pid)
    done = workers.wait(job_id, timeout=600)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2
    assert (done["result"] or {})["resumed_from_epoch"] >= 3
    epochs = workers.mxq_json("job", str(job_id))["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(1, 41))
    devices = [d for d in workers.mxq_json("devices") if d["device"] in ("cpu:0", "cpu:1")]
    assert all(d["alive"] and d["leased_by"] is None for d in devices)


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_promote_chooses_the_version_infer_uses(workers: Stack) -> None:
    for seed in ("1", "2"):
        code, job = _train(workers, "mlp", "digits", "--name", "promoted", "--epochs", "2",
                           "--seed", seed)
        assert code == 0, job
    assert workers.mxq("models", "promote", "promoted", "1").returncode == 0
    np.save(workers.home / "data" / "digits-flat.npy", datasets.digits().x[:50])
    served = workers.mxq_json("infer", "promoted", "digits-flat.npy", "--wait")
    assert served["model_version"] == 1
    pinned = workers.mxq_json("infer", "promoted:2", "digits-flat.npy", "--wait")
    assert pinned["model_version"] == 2


def test_bad_training_input(workers: Stack) -> None:
    csv = workers.home / "data" / "table.csv"
    csv.write_text("a,b,label\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    wide = workers.home / "data" / "wide.npz"
    np.savez(wide, X=np.zeros((20, 1, 8, 8), np.float32), y=np.arange(20) % 12)
    assert workers.mxq("models", "add", "ten", "--arch", "lenet", "--input-shape", "1,8,8").returncode == 0
    before = workers.mxq_json("models")
    cases = [
        (["lenet", "digits", "--name", "k", "--devices", "3"], "3 devices asked but node"),
        (["vgg", "digits", "--name", "k"], "unknown architecture 'vgg'; known: mlp, lenet, resnet18_v1"),
        (["lenet", "digits", "--name", "k", "--epochs", "0"], "epochs=0"),
        (["lenet", "digits", "--name", "k", "--epochs", "-2"], "epochs=-2"),
        (["lenet", "digits", "--name", "k", "--lr", "-1"], "lr=-1.0"),
        (["lenet", "digits", "--name", "k", "--lr", "nan"], "lr=nan"),
        (["mlp", "table.csv", "--name", "k", "--label-column", "target"],
         "has no label column 'target'; columns: a, b, label"),
        (["lenet", "digits", "--name", "k", "--dtype", "float16"], "--dtype float16 needs GPUs"),
        (["lenet", "wide.npz", "--name", "ten"], "has labels up to 11 but model ten has 10 classes"),
        (["lenet", "missing.npz", "--name", "k"], "dataset missing.npz does not exist"),
    ]
    for args, needle in cases:
        code, job = _train(workers, *args)
        assert code == 1, (args, job)
        error = job.get("error") or job["stderr"]
        assert needle in error, (args, error)
        assert "Traceback" not in error
    assert workers.mxq_json("models") == before  # nothing half-registered
    ok = workers.wait(submit(workers.settings, "probe", dict(SMALL), "cpu:1"))
    assert ok["status"] == "succeeded"



def test_epoch_figures_equal_a_plain_evaluation() -> None:
    """The loss and accuracy computed inside the training graph: with a learning rate of 0 the
    weights stay put, so they must equal an evaluation of the same net over the same samples."""
    from mxnet import gluon

    from mxq.tasks.training import train_loop as fit
    from mxq.tasks.training.train_loop import run_epoch, train_step

    data = datasets.digits().for_training()
    p = TrainParams(arch="lenet", dataset="digits", name="x", epochs=1, batch_size=20, seed=5)
    assert len(data.y) / p.batch_size > fit.FOLD_BATCHES  # the sums are folded during the epoch
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net = make_net(p, data.classes, data.sample_shape, ctxs)
    frozen = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.0}, kvstore="local")
    loss, accuracy, _, n = run_epoch(train_step(net), frozen, data, ctxs, p, 1, lambda f: None)
    out = net(mx.nd.array(data.x, ctx=ctxs[0]))
    want_loss = gluon.loss.SoftmaxCrossEntropyLoss()(out, mx.nd.array(data.y, ctx=ctxs[0]))
    want_accuracy = float((out.argmax(axis=1).asnumpy() == data.y).mean())
    assert n == len(data.y)
    assert 0.0 < accuracy < 0.5  # an untrained net: the figure is not trivially 0 or 1
    assert accuracy == want_accuracy
    assert abs(loss - float(want_loss.mean().asscalar())) < 1e-4


def test_a_training_child_that_dies_tells_its_leader_why(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected end of the child (a database unreachable past its retry window, say) is the
    job's one-line error, not "training process exited with 1"."""
    from mxq.db.fence import Fence
    from mxq.db.retry import DatabaseUnreachable
    from mxq.tasks.job_context import JobFailed
    from mxq.tasks.training.train_child import report_crash
    from mxq.tasks.training.train_task import _outcome, run_file
    from mxq.workers.settings import get_settings

    monkeypatch.setenv("MXQ_HOME", str(tmp_path))
    get_settings.cache_clear()
    try:
        fence = Fence(5, "cpu0@n", 2)
        out = run_file(get_settings(), fence)
        out.parent.mkdir(parents=True)
        for exc, said in ((DatabaseUnreachable("database unreachable at db:5432 for 120 s: refused\nmore"),
                           "database unreachable at db:5432 for 120 s: refused"),
                          (KeyError("w"), "KeyError: 'w'")):
            report_crash(get_settings(), fence, exc, ["cpu:0"])
            with pytest.raises(JobFailed) as failed:
                _outcome(1, out)
            assert str(failed.value) == said
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize(("code", "report", "said"), [
    (0, '{"samples": 640, "seconds": 1.5}',
     "job-5.n-2.json is malformed (expected Trained): result: Field required"),
    (0, '{"samples": "many", "seconds": 1.5, "result": {}}',
     "job-5.n-2.json is malformed (expected Trained): samples: Input should be a valid integer"),
    (4, '{"samples": 64, "error": "x"}',
     "job-5.n-2.json is malformed (expected Stopped): error: Extra inputs are not permitted"),
    (5, '["lost"]', "job-5.n-2.json is malformed (expected Refused): the report: Input should be"),
    (3, '{"error": "bad', "job-5.n-2.json is not JSON: Unterminated string"),
])
def test_a_malformed_training_report_fails_the_job_in_one_line(
        tmp_path: Path, code: int, report: str, said: str) -> None:
    """The leader reads the child's report as the shape its exit status says; one that does not
    fit fails the job with one line naming the file and the field, not a KeyError."""
    from mxq.tasks.job_context import JobFailed
    from mxq.tasks.training.train_task import _outcome

    out = tmp_path / "job-5.n-2.json"
    out.write_text(report)
    with pytest.raises(JobFailed) as failed:
        _outcome(code, out)
    message = str(failed.value)
    assert message.startswith("the training child's report ") and said in message, message
    assert "\n" not in message


def test_a_training_report_reads_back_as_the_child_wrote_it(tmp_path: Path) -> None:
    from mxq.tasks.job_context import JobCancelled, JobInputError, JobLost
    from mxq.tasks.training import child_report
    from mxq.tasks.training.train_task import CHILD_CANCELLED, CHILD_INPUT_ERROR, CHILD_LOST, _outcome

    out = tmp_path / "job-5.n-2.json"
    child_report.write(out, child_report.Trained(samples=640, seconds=1.5,
                                                 result={"model": "m", "train_loss": float("nan")}))
    done = _outcome(0, out)
    assert (done.samples, done.seconds, done.result["model"]) == (640, 1.5, "m")
    assert done.result["train_loss"] != done.result["train_loss"]  # NaN stays NaN, as json writes it
    child_report.write(out, child_report.Stopped(samples=128))
    with pytest.raises(JobCancelled) as cancelled:
        _outcome(CHILD_CANCELLED, out)
    assert cancelled.value.samples == 128
    for code, raised in ((CHILD_LOST, JobLost), (CHILD_INPUT_ERROR, JobInputError)):
        child_report.write(out, child_report.Refused(error="why, in one line"))
        with pytest.raises(raised, match="^why, in one line$"):
            _outcome(code, out)
    out.unlink()  # killed before it wrote one
    with pytest.raises(JobCancelled) as cancelled:
        _outcome(CHILD_CANCELLED, out)
    assert cancelled.value.samples is None
    with pytest.raises(JobLost, match="handed to another attempt"):
        _outcome(CHILD_LOST, out)


def test_a_training_child_that_died_of_a_device_fault_is_the_devices_not_the_jobs(tmp_path: Path) -> None:
    """The child's CUDA error was a failed training (JobFailed, no retry); it is a device fault:
    the job resumes from its checkpoint elsewhere (`mxq.tasks.runner`). Its own errors stay its."""
    from mxq.errors import DeviceFault
    from mxq.tasks.job_context import JobFailed
    from mxq.tasks.training import child_report
    from mxq.tasks.training.train_task import _outcome

    out = tmp_path / "job-6.n-2.json"
    child_report.write(out, child_report.Refused(
        error="MXNetError: Check failed: e == cudaSuccess (214 vs. 0) : CUDA: uncorrectable ECC error "
              "encountered"))
    with pytest.raises(DeviceFault, match="uncorrectable ECC error"):
        _outcome(1, out)
    for own in ("ValueError: the loss is NaN", "MXNetError: cudaMalloc retry failed: out of memory"):
        child_report.write(out, child_report.Refused(error=own))
        with pytest.raises(JobFailed, match=own):
            _outcome(1, out)


# MXNet 1.9.1's error as its C++ side raises it: the traceback header first, the words last.
MXNET_CUDA_ERROR = ('Traceback (most recent call last):\n  File "../src/storage/./gpu_device_storage.h", '
                    'line 75\nCheck failed: e == cudaSuccess (214 vs. 0) : CUDA: '
                    'uncorrectable ECC error encountered')


def test_a_childs_device_fault_is_judged_on_its_whole_error_and_a_fatal_signal_is_one(
        store: Settings, tmp_path: Path) -> None:
    """Issue 60: the child reported its error's first line, which MXNet 1.9.1 makes "Traceback
    (most recent call last):" for every error, so a CUDA fault failed the job and the GPU stayed
    in service; a child CUDA aborts (SIGABRT) failed as "exited with -6". The child now judges
    the whole error, and a child dead of a fatal signal without a report is the device's."""
    from mxq.db.fence import Fence
    from mxq.errors import DeviceFault
    from mxq.tasks.job_context import JobFailed
    from mxq.tasks.training.train_child import report_crash
    from mxq.tasks.training.train_task import _outcome, run_file

    fence = Fence(7, "cpu0@node", 1)
    run_file(store, fence).parent.mkdir(parents=True, exist_ok=True)  # the leader makes it
    report_crash(store, fence, mx.base.MXNetError(MXNET_CUDA_ERROR), ["gpu:2", "gpu:5"])
    with pytest.raises(DeviceFault) as fault:
        _outcome(1, run_file(store, fence))
    assert str(fault.value) == ("MXNetError: Check failed: e == cudaSuccess (214 vs. 0) : CUDA: "
                                "uncorrectable ECC error encountered")
    assert fault.value.devices == ()  # it names no context: every device of the job is suspect
    # one that names its context (the child's gpu(1), the job's second device) blames that one
    report_crash(store, fence, mx.base.MXNetError(MXNET_CUDA_ERROR + " on gpu(1)"), ["gpu:2", "gpu:5"])
    with pytest.raises(DeviceFault) as fault:
        _outcome(1, run_file(store, fence))
    assert fault.value.devices == ("gpu:5",)
    report_crash(store, fence, mx.base.MXNetError(
        'Traceback (most recent call last):\n  File "../src/ndarray/ndarray.cc", line 250\n'
        'NDArray.Reshape: Check failed: shape_.Size() >= shape.Size() (4 vs. 9)'), ["gpu:2", "gpu:5"])
    with pytest.raises(JobFailed, match="Traceback"):  # the model's own: a failed job, as before
        _outcome(1, run_file(store, fence))
    run_file(store, fence).unlink()
    aborted = subprocess.run([sys.executable, "-c", "import os; os.abort()"], capture_output=True)
    assert aborted.returncode == -signal.SIGABRT
    with pytest.raises(DeviceFault, match="died by SIGABRT during its device work"):
        _outcome(aborted.returncode, run_file(store, fence))
    with pytest.raises(JobFailed, match="exited with -9"):  # SIGKILL: the OOM killer's, say
        _outcome(-9, run_file(store, fence))


def test_a_training_child_s_hang_report_is_a_fault_of_every_device_not_the_job_s(tmp_path: Path) -> None:
    """Issue 60, item 3: the child's watch thread reports a batch stuck on the devices as a device
    fault naming none of them (which of K hung is unknown: each is probed) and exits CHILD_HUNG."""
    from mxq.errors import DeviceFault
    from mxq.tasks.training import child_report
    from mxq.tasks.training.train_task import CHILD_HUNG, _outcome

    out = tmp_path / "job-7.n-1.json"
    why = ("no batch finished on cpu:0, cpu:1 for 301 s (MXQ_DEVICE_HANG_SECONDS 300): the device is "
           "taken out as hung")
    child_report.write(out, child_report.Refused(error=why, device_fault=True))
    with pytest.raises(DeviceFault) as raised:
        _outcome(CHILD_HUNG, out)
    assert str(raised.value) == why and raised.value.devices == ()
