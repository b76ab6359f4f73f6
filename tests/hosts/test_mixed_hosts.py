"""A host with GPUs of two kinds: an A100 and an L40S that MXNet runs, and an H200 that only ONNX
Runtime runs (the gpu-onnx extra). Inference may go to every GPU; training and probes only to the
ones MXNet runs: through the pool, through a named device, through a device list and through the
leases of a multi-device training. No GPU exists here: the workers are rows as their launcher and
heartbeat write them (with the engines each device runs), and nothing consumes what is queued.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mxq.db.fleet import register
from mxq.db.reports.history import require_job
from mxq.errors import JobRejected
from mxq.json_types import JsonObject
from mxq.tasks.job_context import JobInputError
from mxq.tasks.training.train_task import choose_devices
from mxq.workers.broker.routing import RoutingError
from mxq.workers.hardware.devices import parse_nvidia_smi
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.jobs.submit import submit
from mxq.workers.launch import launcher
from mxq.workers.settings import Settings
from tests.conftest import FIXTURES, NODE, Stack

pytestmark = pytest.mark.both_legs

A100 = {"name": "NVIDIA A100-SXM4-80GB", "compute_cap": "8.0"}
L40S = {"name": "NVIDIA L40S", "compute_cap": "8.9"}
H200 = {"name": "NVIDIA H200", "compute_cap": "9.0"}
TRAIN: JsonObject = {"arch": "mlp", "dataset": "digits", "name": "mixed", "epochs": 1}


def _mixed(stack: Stack) -> Settings:
    """gpu:0 (A100) and gpu:1 (L40S) run both engines, gpu:2 (H200) ONNX Runtime only."""
    s = stack.settings
    for index, info, engines in ((0, A100, ("mxnet", "onnx")), (1, L40S, ("mxnet", "onnx")),
                                 (2, H200, ("onnx",))):
        register(s.database, f"gpu{index}@{NODE}", NODE, f"gpu:{index}", f"{NODE}.gpu.{index}",
                 None, info, engines=engines)
    return s


@pytest.fixture
def mixed(isolated: Stack) -> Stack:
    model = isolated.mxq("models", "add", "m4", "--arch", "mlp", "--input-shape", "4",
                         "--classes", "3", "--json")
    assert model.returncode == 0, model.stderr
    np.save(isolated.home / "data" / "x.npy", np.ones((8, 4), np.float32))
    _mixed(isolated)  # (beating from now: registering a model takes longer than a heartbeat)
    return isolated


def _queue(stack: Stack, job_id: int) -> str | None:
    return require_job(stack.settings.database, job_id)["queue"]


def test_the_launcher_gives_the_h200_no_pool_that_trains(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from mxq.workers.hardware import devices

    monkeypatch.setattr(launcher, "onnx_runs_gpus", lambda: True)
    monkeypatch.setattr(devices, "onnx_runs_gpus", lambda: True)
    gpus = parse_nvidia_smi((FIXTURES / "nvidia-smi" / "a100-l40s-h200.csv").read_text())
    specs, refused = launcher.plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")
    assert refused == []
    queues = {s.name: s.queues for s in specs}
    assert queues["gpu2@box1"] == ["box1.gpu.2", "pool.gpu", "pool.gpu.onnx"]
    assert queues["gpu0@box1"] == ["box1.gpu.0", "pool.gpu", "pool.gpu.mxnet", "pool.gpu.onnx"]
    assert {s.name: s.engines for s in specs}["gpu2@box1"] == ("onnx",)


def test_trainings_and_probes_go_to_the_mxnet_pool(mixed: Stack) -> None:
    s = mixed.settings
    assert _queue(mixed, submit(s, "train", TRAIN, "auto:gpu")) == "pool.gpu.mxnet"
    assert _queue(mixed, submit(s, "probe", {}, "auto")) == "pool.gpu.mxnet"


def test_inference_goes_where_its_engine_runs(mixed: Stack) -> None:
    s = mixed.settings
    job = {"model": "m4", "input": "x.npy"}
    assert _queue(mixed, submit(s, "infer", job, "auto:gpu")) == "pool.gpu"  # every GPU serves it
    assert _queue(mixed, submit(s, "infer", {**job, "engine": "mxnet"}, "auto")) == "pool.gpu.mxnet"
    assert _queue(mixed, submit(s, "infer", {**job, "engine": "onnx"}, "auto")) == "pool.gpu.onnx"
    assert _queue(mixed, submit(s, "infer", job, "gpu:2")) == f"{NODE}.gpu.2"
    with pytest.raises(RoutingError) as refused:
        submit(s, "infer", {**job, "engine": "mxnet"}, "gpu:2")
    assert str(refused.value) == (
        f"device gpu:2 (NVIDIA H200, compute capability 9.0) on node {NODE} runs ONNX Runtime "
        "only, and inference with --engine mxnet needs MXNet; devices that can: gpu:0, gpu:1 (or "
        "--device auto:gpu)")


def test_a_training_named_onto_the_h200_is_refused_at_submit(mixed: Stack) -> None:
    s = mixed.settings
    with pytest.raises(RoutingError, match=r"^device gpu:2 \(NVIDIA H200, compute capability 9.0\) "
                                           r".*a training needs MXNet; devices that can: gpu:0, gpu:1"):
        submit(s, "train", TRAIN, "gpu:2")
    with pytest.raises(RoutingError, match="a probe needs MXNet"):
        submit(s, "probe", {}, "gpu:2")
    with pytest.raises(JobRejected) as listed:  # the list's first device is fine, its second not
        submit(s, "train", {**TRAIN, "device_list": ["gpu:0", "gpu:2"]}, "gpu:0")
    assert "device gpu:2 (NVIDIA H200, compute capability 9.0)" in str(listed.value)
    assert "a training needs MXNet; devices that can: gpu:0, gpu:1" in str(listed.value)
    for k in (2, 3):  # the A100 and the L40S train, but never together unless listed
        with pytest.raises(JobRejected, match=rf"{k} devices asked but node .* has 1 alike \(one kind, "
                                              r"one GPU model\) that run MXNet \(NVIDIA A100-SXM4-80GB: "
                                              r"gpu:0; NVIDIA L40S: gpu:1\)"):
            submit(s, "train", {**TRAIN, "devices": k}, "auto:gpu")


def test_a_multi_device_training_leases_only_gpus_mxnet_runs(mixed: Stack, tmp_path: Path) -> None:
    """The H200 (ONNX Runtime only) never counts. Its A100 and L40S are the node's two GPUs that
    train, but of two models: a 2-device training no longer pairs them (it took gpu:0 and gpu:1,
    so the A100 waited for the L40S every step). Trainings never mix GPU models unless the
    user's --device lists them (issue 45, item 6; tests/hosts/test_one_model_training.py): here
    it fails, as neither model has two GPUs, naming each model's devices."""
    s = mixed.settings.model_copy(update={"nvidia_smi": str(tmp_path / "absent")})
    two = TrainParams(**{**TRAIN, "devices": 2})
    for movable in (False, True):
        with pytest.raises(JobInputError, match=r"that run MXNet \(NVIDIA A100-SXM4-80GB: "
                                                r"gpu:0; NVIDIA L40S: gpu:1\): a training never "
                                                r"mixes GPU models .* unless --device lists them$"):
            choose_devices(s, two, "gpu:0", movable)
    listed = TrainParams(**{**TRAIN, "device_list": ["gpu:0", "gpu:1"]})
    assert choose_devices(s, listed, "gpu:0") == ["gpu:0", "gpu:1"]  # named: the user's choice
    with pytest.raises(JobInputError, match=r"3 devices asked but node \S+ has 2 gpu devices that "
                                            r"run MXNet \(gpu:0, gpu:1\)"):
        choose_devices(s, TrainParams(**{**TRAIN, "devices": 3}), "gpu:0")


def test_no_mxnet_gpu_live_means_no_route_for_a_training(isolated: Stack) -> None:
    s = isolated.settings
    register(s.database, f"gpu2@{NODE}", NODE, "gpu:2", f"{NODE}.gpu.2", None, H200,
             engines=("onnx",))
    with pytest.raises(RoutingError, match=r"no live gpu worker that runs MXNet \(a training needs "
                                           r"it\)"):
        submit(s, "train", TRAIN, "auto:gpu")


def test_a_training_asked_for_any_gpu_is_routed_not_listed(isolated: Stack) -> None:
    """`mxq train --device auto:gpu` was taken for a device list and failed on the worker."""
    proc = isolated.mxq("train", "mlp", "digits", "--name", "anygpu", "--device", "auto:gpu",
                        "--allow-offline", "--json")
    assert proc.returncode == 0, proc.stderr
    job = require_job(isolated.settings.database, json.loads(proc.stdout)["id"])
    assert (job["requested_device"], job["queue"], job["params"]["device_list"]) == \
        ("auto:gpu", "pool.gpu.mxnet", None)


@pytest.mark.parametrize(("listed", "said"), [
    (["auto:gpu"], "--device auto:gpu names no device: list devices of one node (gpu:0,gpu:1), or "
                   "ask for any of a kind as the job's device (auto:gpu)"),
    (["gpu:0@box2"], "--device 'gpu:0@box2' is not a device of this node: list gpu:N or cpu:N"),
    (["gpu:0", "tpu:1"], "--device 'tpu:1' is not a device of this node"),
])
def test_a_device_list_a_worker_would_refuse_is_refused_at_submit(isolated: Stack, listed: list[str],
                                                                 said: str) -> None:
    with pytest.raises(JobRejected) as refused:
        submit(isolated.settings, "train", {**TRAIN, "device_list": listed}, "auto",
               allow_offline=True)
    assert said in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("driver", "refused_words", "warned_words"), [
    ("550.54.15", None, "driver 550.54.15 runs the gpu-onnx extra's CUDA 12.9 libraries (R525+) "
                        "but not the code NVRTC 12.9 compiles at run time (R575+)"),
    ("470.223.02", "driver 470.223.02 is older than R525, which the gpu-onnx extra's CUDA 12 "
                   "libraries need", None),
    ("575.57.08", None, None),
])
def test_the_gpu_onnx_driver_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  caplog: pytest.LogCaptureFixture, driver: str,
                                  refused_words: str | None, warned_words: str | None) -> None:
    """An H200 served by ONNX Runtime on driver 550 said nothing, though NVRTC 12.9's code needs
    R575; below R525 its libraries cannot run at all: refused, naming the driver."""
    from dataclasses import replace

    from mxq.workers.hardware import devices

    monkeypatch.setattr(launcher, "onnx_runs_gpus", lambda: True)
    monkeypatch.setattr(devices, "onnx_runs_gpus", lambda: True)
    gpus = parse_nvidia_smi((FIXTURES / "nvidia-smi" / "a100-l40s-h200.csv").read_text())
    h200 = replace(gpus[2], driver_version=driver)
    specs, refused = launcher.plan(Settings(node="box1", home=tmp_path), [h200], "mxnet-cu112")
    if refused_words:
        assert specs == [] and len(refused) == 1 and refused_words in refused[0], refused
    else:
        assert [s.engines for s in specs] == [("onnx",)] and refused == []
    warned = [r.getMessage() for r in caplog.records if "NVRTC 12.9" in r.getMessage()]
    assert (warned_words in warned[0]) if warned_words else warned == [], warned
