"""The `gpu` extra installed for real, on a host without a GPU (`make test-gpu-install`).

`.venv-gpu` holds mxnet-cu112 and the nvidia-*-cu11 wheels; the NVIDIA driver's library
(`libcuda.so.1`) comes from Debian's `libcuda1` package, unpacked under var/tools/libcuda and put
on the loader path as a driver install puts it in a system folder; nvidia-smi is a fake printing a
recorded listing of an A100, an L40S and an H200. Everything else is the real program: MXNet
loads, finds no GPU, and mxq must still start, plan, refuse and stay up as it would on a host
whose GPUs it cannot use.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mxq.workers.hardware.devices import parse_nvidia_smi
from mxq.workers.hardware.kernels import RECORDED, read_kernels
from tests.conftest import ROOT, free_port, wait_until
from tests.hosts.gpu_host import LISTING, host_env

pytestmark = pytest.mark.gpu_install

GPU_PYTHON = ROOT / ".venv-gpu" / "bin" / "python"
NODE = "gpubox"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "data").mkdir()
    return host_env(tmp_path, GPU_PYTHON, "gpu", NODE, MXQ_DATA_ROOT=str(tmp_path / "data"),
                    MXQ_API_PORT=str(free_port()), MXQ_HEARTBEAT_SECONDS="0.5", COLUMNS="200")


def _run(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPU_PYTHON), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _mxq(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return _run(env, "-m", "mxq.cli", *args, timeout=timeout)


def test_mxnet_finds_the_cuda_wheels_without_ld_library_path(env: dict[str, str]) -> None:
    bare = _run(env, "-c", "import mxnet")
    assert bare.returncode != 0 and "libcu" in bare.stderr  # the wheels' folders are not searched
    loaded = _run(env, "-c", "import mxq.tasks.runtimes.mx as m, mxq.tasks.runtimes.cuda as c; "
                             "print(m.mx.__version__, m.mx.context.num_gpus(), len(c.load_cuda_libraries()))")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["1.9.1", "0", "10"]  # 10 libraries loaded, no GPU here


def test_a_host_without_the_driver_gets_one_clear_error(env: dict[str, str]) -> None:
    no_driver = _run({**env, "LD_LIBRARY_PATH": ""}, "-c", "import mxq.tasks.runtimes.mx")
    assert no_driver.returncode != 0
    assert no_driver.stderr.strip().splitlines()[-1].startswith(
        "ImportError: the GPU build of MXNet cannot load the NVIDIA driver's library (libcuda.so.1")


def test_the_plan_runs_the_a100_and_the_l40s_and_refuses_the_h200(env: dict[str, str]) -> None:
    proc = _mxq(env, "worker", "--dry-run", "--json")
    out = json.loads(proc.stdout)
    pins = {w["worker"]: w["env"]["CUDA_VISIBLE_DEVICES"] for w in out["workers"]}
    uuids = [g.uuid for g in parse_nvidia_smi(LISTING.read_text())]
    assert pins == {f"gpu0@{NODE}": uuids[0], f"gpu1@{NODE}": uuids[1]}, proc.stderr
    (refused,) = out["refused"]
    assert refused.startswith("gpu:2 (NVIDIA H200, compute capability 9.0 = sm_90) cannot run "
                              "the installed mxnet-cu112 1.9.1")


def _pids_of(cmdline_part: str, home: Path) -> list[int]:
    """Processes of this stack (MXQ_HOME=home) whose command line holds `cmdline_part`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit():
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline_part in cmdline and f"MXQ_HOME={home}".encode() in environ:
            found.append(int(entry.name))
    return found


def _get_json(url: str) -> Any:  # the JSON answer, or None
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)
    except OSError:
        return None


def _loads_mxnet(pid: int) -> bool:
    return "libmxnet.so" in Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture
def up(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`mxq up --detach` where every GPU worker refuses (no GPU here): it says so and exits 2,
    and the rest of the stack (schedule process, API) stays up."""
    proc = _mxq(env, "up", "--detach", timeout=300)
    try:
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"mxq: error: no worker of node {NODE} started: gpu0@{NODE}: " in proc.stderr
        yield env
    finally:
        _mxq(env, "down", timeout=120)


def test_up_starts_every_process_and_the_gpu_workers_refuse_once(up: dict[str, str]) -> None:
    env = up
    home = Path(env["MXQ_HOME"])
    added = _mxq(env, "models", "add", "m", "--arch", "mlp", "--input-shape", "16", "--json")
    assert added.returncode == 0 and json.loads(added.stdout)["version"] == 1, added.stderr

    devices = {d["device"]: d for d in json.loads(_mxq(env, "devices", "--json").stdout)}
    assert set(devices) == {"gpu:0", "gpu:1", "gpu:2"}
    h200 = devices.pop("gpu:2")  # refused by the plan: no worker, a row that says why
    assert h200["unplanned"] == "mxnet_build" and h200["health"] == "out", h200
    assert "sm_90" in h200["out_reason"] and h200["alive"] is False, h200
    for d in devices.values():
        assert d["alive"] is False
        assert "sees 0 GPUs through MXNet (expected 1)" in d["refused"], d
        assert d["health"] == "out" and d["out_reason"] == d["refused"] and d["out_since"], d
    launcher = json.loads((home / f"launcher-{NODE}.pid").read_text())["pid"]  # its identity record
    schedule, api = _pids_of(f"-n schedule@{NODE}", home), _pids_of("-m mxq.cli api", home)
    assert schedule and api
    url = f"http://127.0.0.1:{env['MXQ_API_PORT']}/api/v1/devices"
    listed = wait_until(lambda: _get_json(url), 60, f"{url} to answer", until=lambda r: r is not None)
    assert {d["device"] for d in listed} == {"gpu:0", "gpu:1", "gpu:2"}
    log = (home / "logs" / "launcher.log").read_text()
    for name in (f"gpu0@{NODE}", f"gpu1@{NODE}"):
        assert log.count(f"started {name}") == 1, log  # refused once, never restarted
        assert f"{name} refused to start: worker for gpu:" in log
    assert Path(f"/proc/{launcher}").exists()
    assert not any(_loads_mxnet(p) for p in [*schedule, *api, launcher])  # nothing that does not compute


def test_the_recorded_kernels_are_those_of_the_installed_libmxnet(env: dict[str, str]) -> None:
    """What mxq assumes where mxnet-cu112 is named but not installed is what the real binary
    carries: SASS for sm_50, 60, 70, 80 and 86, no PTX (cuobjdump lists the same)."""
    library = next((ROOT / ".venv-gpu" / "lib").glob("python3.*/site-packages/mxnet/libmxnet.so"))
    assert read_kernels(library, "1.9.1") == RECORDED["mxnet-cu112"]
    # what the installed distribution is found to carry, read from it: no fallback to the record
    found = _run(env, "-c", "from mxq.workers.hardware.kernels import installed_kernels as i; "
                            "k = i('mxnet-cu112'); print(k.version, k.sass, k.ptx)")
    assert found.stdout.strip() == "1.9.1 (50, 60, 70, 80, 86) ()", found.stderr


def test_a_process_without_the_driver_registers_through_a_worker(up: dict[str, str]) -> None:
    """The compose `api` container: the GPU build, no GPU reserved, no driver library. `mxq models
    add` there once printed a 108-line traceback; a worker whose device MXNet runs (here a CPU
    node of the same GPU build, with the driver) registers the model instead."""
    env = up
    cpu_node = {**env, "MXQ_NODE": "cpubox", "MXQ_NVIDIA_SMI": "/nonexistent/nvidia-smi",
                "MXQ_CPU_DEVICES": "1"}
    # A second node's launcher in the same home, as a host without the driver runs one: it keeps
    # its own record (launcher-cpubox.pid), and the fixture's `mxq down` ends both.
    launcher = subprocess.Popen([str(GPU_PYTHON), "-m", "mxq.cli", "worker"], cwd=ROOT, env=cpu_node,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: json.loads(_mxq(env, "devices", "--json").stdout), 180,
                   "cpubox's worker to beat", until=lambda ds: any(
                       d["node"] == "cpubox" and d["alive"] for d in ds), interval=1)
        added = _mxq({**env, "LD_LIBRARY_PATH": ""}, "models", "add", "nodriver", "--arch", "mlp",
                     "--input-shape", "8", "--json")
        assert added.returncode == 0, added.stderr
        assert "this process cannot load MXNet (the GPU build of MXNet cannot load the NVIDIA " \
               "driver's library" in added.stderr and "Traceback" not in added.stderr
        record = json.loads(added.stdout)
        assert (record["name"], record["version"], record["input_shape"]) == ("nodriver", 1, [8])
    finally:
        launcher.terminate()
        launcher.wait(timeout=60)
