"""GPUs MXNet cannot run (H100, H200: compute capability 9.0) served by ONNX Runtime.

With ONNX Runtime's GPU build installed (the gpu-onnx extra), the launcher starts a worker for
such a GPU that runs inference on ONNX Runtime, never loads MXNet and refuses training; without
it, the GPU is refused as before. Here no GPU exists: nvidia-smi is a recorded fixture, and the
ONNX Runtime installed is the CPU build, so a real worker for such a GPU refuses to start, with
the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mxq.workers.hardware.devices import parse_nvidia_smi
from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT
from mxq.workers.launch import launcher
from mxq.workers.settings import Settings
from tests.conftest import FIXTURES, ROOT

SMI = FIXTURES / "nvidia-smi"


def _plan(tmp_path: Path, fixture: str, monkeypatch: pytest.MonkeyPatch,
          onnx_gpu: bool) -> tuple[list[launcher.WorkerSpec], list[str]]:
    monkeypatch.setattr(launcher, "onnx_runs_gpus", lambda: onnx_gpu)
    gpus = parse_nvidia_smi((SMI / fixture).read_text())
    return launcher.plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")


def test_an_h200_gets_an_onnx_only_worker_where_onnx_runtime_runs_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs, refused = _plan(tmp_path, "a100-l40s-h200.csv", monkeypatch, onnx_gpu=True)
    assert refused == []
    by_name = {s.name: s for s in specs}
    assert sorted(by_name) == ["gpu0@box1", "gpu1@box1", "gpu2@box1"]
    h200 = by_name["gpu2@box1"].env
    assert h200["MXQ_MXNET_UNUSABLE"].startswith("gpu:2 (NVIDIA H200, compute capability 9.0 = sm_90)")
    assert h200["CUDA_VISIBLE_DEVICES"] == "GPU-3d9f1b27-6c4e-4a8b-b5d2-7e1f0c9a8b6d"
    assert "MXNET_USE_FUSION" not in h200
    assert "MXQ_MXNET_UNUSABLE" not in by_name["gpu1@box1"].env  # the L40S runs MXNet


def test_without_onnx_runtime_for_gpus_the_h200_is_refused(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    specs, refused = _plan(tmp_path, "a100-l40s-h200.csv", monkeypatch, onnx_gpu=False)
    assert [s.name for s in specs] == ["gpu0@box1", "gpu1@box1"]
    assert len(refused) == 1 and refused[0].startswith("gpu:2 (NVIDIA H200")


def test_a_mig_gpu_stays_refused_with_onnx_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs, refused = _plan(tmp_path, "mig-a100.csv", monkeypatch, onnx_gpu=True)
    assert [s.name for s in specs] == ["gpu1@box1"] and "MIG mode enabled" in refused[0]


TASKS = """
import sys
from mxq.workers.celery import app
app.loader.import_default_modules()  # what `celery -A mxq.workers worker` imports at start
print(sorted(t for t in app.tasks if t.startswith("mxq.")), "mxnet" in sys.modules)
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
    return {**env, "MXQ_HOME": str(tmp_path), "MXQ_NODE": "box1", **extra}


def test_an_onnx_only_worker_never_loads_mxnet(tmp_path: Path) -> None:
    env = _env(tmp_path, MXQ_DEVICE="gpu:0", MXQ_MXNET_UNUSABLE="gpu:0 (NVIDIA H200) cannot run MXNet")
    proc = subprocess.run([sys.executable, "-c", TASKS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.strip() == ("['mxq.fire', 'mxq.hooks', 'mxq.infer', 'mxq.openlineage', "
                                   "'mxq.probe', 'mxq.reconcile', "
                                   "'mxq.retention', 'mxq.tick', 'mxq.train'] "
                                   "False"), proc.stderr


def test_a_worker_for_a_gpu_onnx_runtime_cannot_use_refuses_to_start(tmp_path: Path) -> None:
    """The worker exactly as the launcher starts it, on a host where ONNX Runtime cannot run on
    the GPU (here: its CPU build): it exits with REFUSED_EXIT and says why, before consuming."""
    from mxq.db.migrate import upgrade

    upgrade(f"sqlite:///{tmp_path / 'mxq.db'}")
    reason = "gpu:0 (NVIDIA H200, compute capability 9.0 = sm_90) cannot run the installed mxnet-cu112"
    env = _env(tmp_path, MXQ_DEVICE="gpu:0", MXQ_MXNET_UNUSABLE=reason, CUDA_VISIBLE_DEVICES="0")
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "mxq.workers", "worker", "--pool", "solo",
                           "-Q", "box1.gpu.0", "-n", "gpu0@box1", "--without-gossip", "--without-mingle"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == REFUSED_EXIT, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith(REFUSAL_PREFIX)]
    assert lines == [f"{REFUSAL_PREFIX}gpu:0: MXNet cannot run it and this ONNX Runtime has no "
                     "CUDAExecutionProvider for gpu devices: install the gpu-onnx extra (pip install "
                     "'.[gpu-onnx]') to serve inference on it"]


REFUSE = """
from types import SimpleNamespace
from mxq.tasks.runtimes import onnx_worker
from mxq.tasks.job_context import JobInputError
from mxq.workers.settings import get_settings
for body in (onnx_worker.train, onnx_worker.probe):
    try:
        body(SimpleNamespace(device="gpu:2", settings=get_settings()))
    except JobInputError as exc:
        print(exc)
"""


def test_training_and_probe_jobs_on_such_a_gpu_fail_with_the_gpu_and_the_reason(tmp_path: Path) -> None:
    reason = "gpu:2 (NVIDIA H200, compute capability 9.0 = sm_90) cannot run the installed mxnet-cu112 1.9.1"
    proc = subprocess.run([sys.executable, "-c", REFUSE], cwd=ROOT, capture_output=True, text=True,
                          env=_env(tmp_path, MXQ_DEVICE="gpu:2", MXQ_MXNET_UNUSABLE=reason), timeout=120)
    assert proc.stdout.splitlines() == [
        f"gpu:2 cannot run training (it runs on MXNet): {reason}; this device serves inference only "
        "(ONNX Runtime)",
        f"gpu:2 cannot run probe jobs (they run on MXNet): {reason}; this device serves inference only "
        "(ONNX Runtime)"], proc.stderr


@pytest.mark.parametrize(("python", "said"), [
    (sys.executable, "PackageNotFoundError"),  # a real Python without onnxruntime-gpu
    ("/nonexistent/bin/python", "No such file or directory"),
])
def test_an_onnx_python_that_cannot_serve_gpus_refuses_only_those_gpus(tmp_path: Path, python: str,
                                                                       said: str) -> None:
    gpus = parse_nvidia_smi((SMI / "a100-l40s-h200.csv").read_text())
    settings = Settings(node="box1", home=tmp_path, onnx_python=python)
    specs, refused = launcher.plan(settings, gpus, "mxnet-cu112")
    assert [s.name for s in specs] == ["gpu0@box1", "gpu1@box1"]  # MXNet's, from this Python
    assert all(s.command[0] == sys.executable for s in specs)
    (why,) = refused
    assert why.startswith("gpu:2 (NVIDIA H200")
    assert f"MXQ_ONNX_PYTHON={python} cannot serve it (" in why and said in why
    assert why.endswith("install mxq with the gpu-onnx extra there (pip install -e '.[gpu-onnx]')")
