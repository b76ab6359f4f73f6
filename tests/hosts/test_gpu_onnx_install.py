"""The `gpu-onnx` extra installed for real, alone, on a host without a GPU (`make test-gpu-install`).

`.venv-gpu-onnx` holds onnxruntime-gpu and the nvidia-*-cu12 wheels and no MXNet: a host whose
GPUs MXNet cannot run (H100, H200), with the driver and nvidia-smi of tests/hosts/gpu_host.py. mxq
must plan an inference worker (ONNX Runtime only) for every GPU, and that worker, finding no
GPU, must refuse to start with the reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mxq.workers.hardware.devices import parse_nvidia_smi
from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT
from tests.conftest import ROOT, free_port
from tests.hosts.gpu_host import LISTING, host_env

pytestmark = pytest.mark.gpu_install

ONNX_PYTHON = ROOT / ".venv-gpu-onnx" / "bin" / "python"
NODE = "hopperbox"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return host_env(tmp_path, ONNX_PYTHON, "gpu-onnx", NODE)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ONNX_PYTHON), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


def test_onnx_runtime_for_gpus_installs_without_mxnet(env: dict[str, str]) -> None:
    proc = _run(env, "-c", "import importlib.util, onnxruntime as o; "
                           "print(o.__version__, importlib.util.find_spec('mxnet') is None)")
    assert proc.stdout.split() == ["1.23.2", "True"], proc.stderr


PROVIDER_LOADS = """
import ctypes, os, pathlib, sys
import onnxruntime as ort
from mxq.tasks.runtimes import onnx_runtime
if sys.argv[1] == "mxq":
    onnx_runtime.load_cuda_wheels(ort)  # what a worker does before its first CUDA session
library = pathlib.Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
try:
    ctypes.CDLL(str(library), mode=os.RTLD_NOW)  # every library it needs, resolved now
    print("loaded")
except OSError as exc:
    print(exc)
"""


def test_the_cuda_provider_finds_every_library_it_needs(env: dict[str, str]) -> None:
    """`'CUDAExecutionProvider' in get_available_providers()` is true even while libcublasLt.so.12
    cannot be found; the provider's library, loaded with every symbol resolved, is not."""
    assert _run(env, "-c", PROVIDER_LOADS, "mxq").stdout.strip() == "loaded"
    bare = _run(env, "-c", PROVIDER_LOADS, "bare").stdout.strip()  # without mxq's loading step
    assert "cannot open shared object file" in bare and ".so.12" in bare


def _plan(env: dict[str, str]) -> dict:
    proc = _run(env, "-m", "mxq.cli", "worker", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_gpu_gets_an_inference_worker_on_onnx_runtime(env: dict[str, str]) -> None:
    plan = _plan(env)
    assert plan["refused"] == []
    assert [(w["worker"], w["engines"], w["env"]["CUDA_VISIBLE_DEVICES"]) for w in plan["workers"]] == [
        (f"gpu{i}@{NODE}", ["onnx"], g.uuid)
        for i, g in enumerate(parse_nvidia_smi(LISTING.read_text()))]
    for w in plan["workers"]:
        assert "the installed MXNet is missing" in w["env"]["MXQ_MXNET_UNUSABLE"]


def test_a_worker_that_finds_no_gpu_refuses_with_the_reason(env: dict[str, str]) -> None:
    """The worker exactly as the launcher would start it (its command and settings from the plan)."""
    from mxq.db.migrate import upgrade

    home = Path(env["MXQ_HOME"])
    home.mkdir(parents=True)
    upgrade(f"sqlite:///{home / 'mxq.db'}")
    worker = _plan(env)["workers"][2]  # the H200
    assert Path(worker["command"][0]).parent == ONNX_PYTHON.parent
    proc = subprocess.run(worker["command"], cwd=ROOT, env={**env, **worker["env"]}, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == REFUSED_EXIT, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith(REFUSAL_PREFIX)]
    assert line.startswith(f"{REFUSAL_PREFIX}ONNX Runtime's CUDA provider cannot start on gpu:2 "
                           "(CUDA failure ")
    assert "no GPU visible, or the driver is missing or older than R525" in line
    assert "libmxnet" not in proc.stderr


def test_up_detached_fails_naming_each_refusal_when_no_worker_starts(env: dict[str, str]) -> None:
    """Every GPU worker refused (no GPU here): `mxq up --detach` once exited 0 as if the node ran."""
    env = {**env, "MXQ_API_PORT": str(free_port())}
    try:
        proc = _run(env, "-m", "mxq.cli", "up", "--detach", "--timeout", "200")
        assert proc.returncode == 2, proc.stdout
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("mxq: error: ")]
        assert line.startswith(f"mxq: error: no worker of node {NODE} started: gpu0@{NODE}: ONNX "
                               "Runtime's CUDA provider cannot start on gpu:0"), proc.stderr
        assert all(f"gpu{i}@{NODE}: " in line for i in range(3)) and "Traceback" not in proc.stderr
        assert "`mxq down` stops them" in line
    finally:
        assert _run(env, "-m", "mxq.cli", "down").returncode == 0


FALLS_BACK = """
import sys, pathlib
from onnx import TensorProto, helper, save
from mxq.tasks.runtimes import onnx_runtime
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
path = pathlib.Path(sys.argv[1])
save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
print(onnx_runtime.session(path, "cpu")[0].get_providers())
try:
    onnx_runtime.session(path, "gpu")
    print("served")
except onnx_runtime.ProviderFallback as exc:
    print(exc)
"""


def test_a_gpu_session_that_falls_back_to_the_cpu_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    """onnxruntime-gpu on a host where CUDA cannot start gives a session asked for the CUDA
    provider with only the CPU one (and a warning): it once served a job recorded on gpu:3."""
    proc = _run(env, "-c", FALLS_BACK, str(tmp_path / "identity.onnx"))
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "['CPUExecutionProvider']", proc.stderr
    assert lines[-1].startswith("ONNX Runtime gave a session with providers ['CPUExecutionProvider'] "
                                "for a gpu device, not CUDAExecutionProvider first"), proc.stdout
