"""A mixed GPU host installed as docs/gpu-hosts.md says (`make test-gpu-install`): the `gpu` extra in
`.venv-gpu` (MXNet for the A100 and the L40S) and the `gpu-onnx` extra in an environment of its
own, `.venv-gpu-onnx` (ONNX Runtime for the H200), named by MXQ_ONNX_PYTHON. The two extras'
NVIDIA wheels share files, so they never share an environment: each environment has every file
owned once, and one launcher starts each GPU's worker from the environment that runs it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from tests.hosts.gpu_host import host_env

pytestmark = pytest.mark.gpu_install

GPU_PYTHON = ROOT / ".venv-gpu" / "bin" / "python"
ONNX_PYTHON = ROOT / ".venv-gpu-onnx" / "bin" / "python"
NODE = "mixedbox"
OWNED_TWICE = """
import json
from importlib import metadata
from mxq.workers.hardware.wheels import problems, shared_files
print(json.dumps({"shared": shared_files(metadata.distributions()), "problems": problems()}))
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    host_env(tmp_path, ONNX_PYTHON, "gpu-onnx", NODE)  # (skips, or fails under CI, without it)
    return host_env(tmp_path, GPU_PYTHON, "gpu", NODE, MXQ_ONNX_PYTHON=str(ONNX_PYTHON))


@pytest.mark.parametrize("python", [GPU_PYTHON, ONNX_PYTHON], ids=["gpu", "gpu-onnx"])
def test_no_installed_file_is_owned_by_two_distributions(env: dict[str, str], python: Path) -> None:
    proc = subprocess.run([str(python), "-c", OWNED_TWICE], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"shared": {}, "problems": []}


def test_one_launcher_starts_each_gpu_from_the_environment_that_runs_it(env: dict[str, str]) -> None:
    proc = subprocess.run([str(GPU_PYTHON), "-m", "mxq.cli", "worker", "--dry-run", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["refused"] == []
    workers = {w["worker"]: w for w in plan["workers"]}
    for name in (f"gpu0@{NODE}", f"gpu1@{NODE}"):  # the A100 and the L40S: MXNet, this venv
        assert Path(workers[name]["command"][0]) == GPU_PYTHON
        assert workers[name]["engines"] == ["mxnet"]  # (no ONNX Runtime in the gpu venv)
        assert "pool.gpu.mxnet" in workers[name]["queues"]
    h200 = workers[f"gpu2@{NODE}"]
    assert Path(h200["command"][0]) == ONNX_PYTHON and h200["engines"] == ["onnx"]
    assert h200["queues"] == [f"{NODE}.gpu.2", "pool.gpu", "pool.gpu.onnx"]  # nothing that trains
    assert "MXQ_MXNET_UNUSABLE" in h200["env"]
    assert h200["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-3d9f1b27")  # pinned by UUID


def test_an_onnx_python_without_onnx_runtime_for_gpus_refuses_the_h200_saying_why(
        env: dict[str, str]) -> None:
    env = {**env, "MXQ_ONNX_PYTHON": str(GPU_PYTHON)}  # the gpu venv: no onnxruntime-gpu there
    proc = subprocess.run([str(GPU_PYTHON), "-m", "mxq.cli", "worker", "--dry-run", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    (refused,) = json.loads(proc.stdout)["refused"]
    assert refused.startswith("gpu:2 (NVIDIA H200, compute capability 9.0 = sm_90) cannot run")
    assert f"MXQ_ONNX_PYTHON={GPU_PYTHON} cannot serve it (" in refused
    assert "install mxq with the gpu-onnx extra there (pip install -e '.[gpu-onnx]')" in refused


def test_the_two_extras_in_one_environment_would_be_refused(env: dict[str, str]) -> None:
    """Both environments' wheels read as one (what `pip install '.[gpu,gpu-onnx]'` would make):
    libraries owned twice, the launcher's refusal naming them and the fix."""
    sites = [str(next((ROOT / venv / "lib").glob("python3.*/site-packages")))
             for venv in (".venv-gpu", ".venv-gpu-onnx")]
    code = f"from mxq.workers.hardware.wheels import problems; print(problems({sites!r})[0])"
    proc = subprocess.run([str(GPU_PYTHON), "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    said = proc.stdout.strip()
    assert said.startswith("the gpu and gpu-onnx extras are installed in one environment: nvidia-"), \
        proc.stderr
    assert "-cu11 and nvidia-" in said and "-cu12 both own nvidia/" in said
    owned_twice = int(said.split("(")[1].split(" files are owned twice")[0])
    assert owned_twice >= 10  # (125 measured with the versions pinned in pyproject.toml)


def test_a_training_onto_the_h200_is_refused_at_submit(env: dict[str, str]) -> None:
    """The mixed host brought up as docs/gpu-hosts.md says (every worker refuses here: no GPU), then
    trainings asked of it: each refused at submit, naming the H200 and the GPUs that train."""
    env = {**env, "MXQ_API_PORT": str(free_port())}

    def mxq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(GPU_PYTHON), "-m", "mxq.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    try:
        up = mxq("up", "--detach")
        assert up.returncode == 2 and f"no worker of node {NODE} started" in up.stderr, up.stderr
        devices = {d["device"]: d["engines"] for d in json.loads(mxq("devices", "--json").stdout)}
        assert devices == {"gpu:0": ["mxnet"], "gpu:1": ["mxnet"], "gpu:2": ["onnx"]}
        train = ("train", "mlp", "digits", "--name", "mixed", "--allow-offline")
        named = mxq(*train, "--device", "gpu:2")
        assert named.returncode == 1 and named.stderr.strip().endswith(  # a job recorded failed
            f"device gpu:2 (NVIDIA H200, compute capability 9.0) on node {NODE} runs ONNX Runtime "
            "only, and a training needs MXNet; devices that can: gpu:0, gpu:1"), named.stderr
        listed = mxq(*train, "--device", "gpu:0,gpu:2")
        assert listed.returncode == 1 and "a training needs MXNet; devices that can: gpu:0, gpu:1" \
            in listed.stderr
        three = mxq(*train, "--devices", "3")
        assert three.returncode == 1 and f"3 devices asked but node {NODE} has 1 alike (one kind, " \
            "one GPU model) that run MXNet (NVIDIA A100-SXM4-80GB: gpu:0; NVIDIA L40S: gpu:1)" \
            in three.stderr, three.stderr
    finally:
        assert mxq("down").returncode == 0


@pytest.mark.parametrize(("python", "extra"), [(GPU_PYTHON, "gpu"), (ONNX_PYTHON, "gpu-onnx")],
                         ids=["gpu", "gpu-onnx"])
def test_every_nvidia_wheel_installed_is_pinned_by_its_extra(env: dict[str, str], python: Path,
                                                             extra: str) -> None:
    """Unpinned, onnxruntime-gpu's [cuda,cudnn] extras took the newest CUDA 12 (12.9, whose NVRTC
    needs R575+) while the README said R525: every NVIDIA wheel is now pinned where its driver
    need is stated."""
    import tomllib

    pins = dict(p.split("==") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
                ["project"]["optional-dependencies"][extra] if "==" in p and p.startswith("nvidia-"))
    listed = subprocess.run([str(python), "-c", "import json; from mxq.workers.hardware.wheels import "
                             "nvidia_wheels as n; print(json.dumps({d.metadata['Name']: d.version "
                             "for d in n()}))"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert json.loads(listed.stdout) == pins, listed.stderr
