"""Device discovery and the MXNet-build check, on recorded nvidia-smi output."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, Stack
from workers.devices import DeviceError, discover, incompatibility, parse_nvidia_smi
from workers.launcher import plan
from workers.settings import Settings

SMI = FIXTURES / "nvidia-smi"


def fake_nvidia_smi(tmp_path: Path, fixture: str) -> Path:
    """An `nvidia-smi` that prints recorded output (the GPU cannot exist here)."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\ncat '{SMI / fixture}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_parses_four_a100s() -> None:
    gpus = parse_nvidia_smi((SMI / "a100x4.csv").read_text())
    assert [g.label for g in gpus] == ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert gpus[2].memory_used_mib == 30521 and gpus[2].memory_total_mib == 81920
    assert gpus[0].uuid.startswith("GPU-8f6a") and gpus[0].compute_cap == "8.0"
    assert gpus[0].name == "NVIDIA A100-SXM4-80GB"


def test_unavailable_figures_parse_as_none() -> None:
    gpus = parse_nvidia_smi((SMI / "mixed-a6000-h100.csv").read_text())
    assert gpus[1].memory_used_mib is None and gpus[1].name == "NVIDIA H100 80GB HBM3"


def test_unexpected_header_is_a_clear_error() -> None:
    with pytest.raises(DeviceError, match="unexpected nvidia-smi header"):
        parse_nvidia_smi("index, name\n0, X\n")


def test_host_without_nvidia_smi_offers_cpu_devices(tmp_path: Path) -> None:
    devices = discover(str(tmp_path / "absent"), 3)
    assert [d.label for d in devices] == ["cpu:0", "cpu:1", "cpu:2"]


def test_hopper_is_refused_by_mxnet_cu112() -> None:
    h200 = parse_nvidia_smi((SMI / "h200x1.csv").read_text())[0]
    message = incompatibility(h200, "mxnet-cu112")
    assert "compute capability 9.0 = sm_90" in message and "sm_86" in message
    assert "no PTX" in message and "NVIDIA H200" in message
    a100 = parse_nvidia_smi((SMI / "a100x4.csv").read_text())[0]
    assert incompatibility(a100, "mxnet-cu112") is None
    assert "CPU-only build" in incompatibility(a100, "mxnet")


def test_gpu_workers_are_pinned_one_gpu_each(tmp_path: Path) -> None:
    settings = Settings(node="box1", home=tmp_path)
    gpus = parse_nvidia_smi((SMI / "mixed-a6000-h100.csv").read_text())
    specs, refused = plan(settings, gpus, "mxnet-cu112")
    assert [s.name for s in specs] == ["gpu0@box1"] and len(refused) == 1
    assert "gpu:1" in refused[0] and "sm_90" in refused[0]
    env = specs[0].env
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["MXQ_DEVICE"] == "gpu:0"
    assert specs[0].queues == ["box1.gpu.0", "pool.gpu"]
    cmd = specs[0].command
    assert cmd[cmd.index("--pool") + 1] == "solo" and cmd[cmd.index("-n") + 1] == "gpu0@box1"
    assert cmd[cmd.index("--prefetch-multiplier") + 1] == "1"


def test_cpu_workers_split_the_cores_and_see_no_gpu(tmp_path: Path) -> None:
    settings = Settings(node="box1", home=tmp_path)
    specs, _ = plan(settings, discover(str(tmp_path / "absent"), 2), "mxnet")
    for spec in specs:
        assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
        assert int(spec.env["OMP_NUM_THREADS"]) == len(spec.cores) >= 1
    assert [s.queues for s in specs] == [["box1.cpu.0", "pool.cpu"], ["box1.cpu.1", "pool.cpu"]]


def _worker_cli(tmp_path: Path, fixture: str, build: str) -> tuple[int, str, dict]:
    stack = Stack("cli", tmp_path, {"MXQ_HOME": str(tmp_path), "MXQ_NODE": "box1",
                                    "MXQ_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path, fixture)),
                                    "MXQ_MXNET_BUILD": build})
    proc = stack.mxq("worker", "--dry-run", "--json")
    return proc.returncode, proc.stderr, json.loads(proc.stdout) if proc.stdout else {}


def test_worker_cli_pins_each_gpu(tmp_path: Path) -> None:
    code, _, out = _worker_cli(tmp_path, "a100x4.csv", "mxnet-cu112")
    assert code == 0 and out["refused"] == []
    pins = {w["worker"]: w["env"]["CUDA_VISIBLE_DEVICES"] for w in out["workers"]}
    assert pins == {f"gpu{i}@box1": str(i) for i in range(4)}


def test_worker_refuses_a_gpu_its_mxnet_has_no_kernels_for(tmp_path: Path) -> None:
    code, _, out = _worker_cli(tmp_path, "h200x1.csv", "mxnet-cu112")
    assert code == 1 and out["workers"] == []
    assert "sm_90" in out["refused"][0] and "mxnet-cu112 1.9.1" in out["refused"][0]
    stack = Stack("cli", tmp_path, {"MXQ_HOME": str(tmp_path), "MXQ_NODE": "box1",
                                    "MXQ_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path, "h200x1.csv")),
                                    "MXQ_MXNET_BUILD": "mxnet-cu112"})
    proc = stack.mxq_process("worker")  # the real start, not a dry run: refuses before starting anything
    assert proc.returncode == 1
    assert "refusing gpu:0 (NVIDIA H200, compute capability 9.0 = sm_90)" in proc.stderr
    assert not (tmp_path / "logs").exists()


def test_cli_imports_no_mxnet() -> None:
    import subprocess
    import sys

    code = "import cli.main, sys; print('mxnet' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_container_seeing_one_gpu_keeps_its_host_index(tmp_path: Path) -> None:
    """As in docker-compose: the container of host GPU 1 sees it as its only GPU, index 0."""
    one = tmp_path / "one.csv"
    one.write_text("\n".join((SMI / "a100x4.csv").read_text().splitlines()[:2]) + "\n")
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\ncat '{one}'\n")
    exe.chmod(0o755)
    settings = Settings(node="box1", home=tmp_path, host_gpus="1")
    (gpu,) = discover(str(exe), 2, settings.host_gpu_ids)
    specs, _ = plan(settings, [gpu], "mxnet-cu112")
    assert specs[0].name == "gpu1@box1" and specs[0].queues[0] == "box1.gpu.1"
    assert specs[0].env["CUDA_VISIBLE_DEVICES"] == "0"
