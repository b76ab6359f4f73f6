"""Each GPU worker is pinned by its GPU's UUID (issue 60, item 7): CUDA counts GPUs fastest
first unless told otherwise, NVML and nvidia-smi in PCI bus order, so `CUDA_VISIBLE_DEVICES=1`
could be another GPU than nvidia-smi's gpu:1. With the UUID the worker's context 0 is that exact
GPU; a training child gets its K devices' UUIDs, in order.

No GPU exists here: nvidia-smi is a recorded listing whose UUIDs are known, and a `sitecustomize`
makes a GPU worker's MXNet count one GPU and give a CPU context for `mx.gpu(i)`, so the real
workers the real launcher starts pass their start check and beat; their environment is read from
/proc, as the kernel holds it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxq.db.fleet import alive_since, list_workers
from mxq.db.schema import utcnow
from mxq.tasks.training.train_task import child_env
from mxq.workers.hardware.devices import parse_nvidia_smi
from mxq.workers.launch.launcher import plan
from mxq.workers.settings import Settings
from tests.conftest import FIXTURES, NODE, ROOT, Stack, stop, wait_until

SMI = FIXTURES / "nvidia-smi"
LISTING = SMI / "a100x2-exclusive.csv"
UUIDS = ("GPU-5c1d9e2a-7b3f-4c8e-a6d1-0f9b2e4c7a35", "GPU-b7e24f60-1a9c-4d5b-8e3f-62c0a7d19b84")

# Loaded by every Python process of the stack (PYTHONPATH); acts only in a GPU device worker.
STAND_IN = '''
import os
if os.environ.get("MXQ_DEVICE", "").startswith("gpu:"):
    from mxq.tasks.runtimes.mx import mx

    mx.context.num_gpus = lambda: 1
    mx.gpu = lambda device_id=0: mx.cpu(device_id)
'''


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment as the kernel holds it (what it was started with)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


@pytest.fixture
def gpu_node(isolated: Stack, tmp_path: Path) -> Iterator[Stack]:
    """`mxq worker` on the recorded two-A100 host, its GPU workers beating."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat '{LISTING}'\n")
    smi.chmod(0o755)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(STAND_IN)
    isolated.env.update(MXQ_NVIDIA_SMI=str(smi), MXQ_MXNET_BUILD="mxnet-cu112")
    since, names = utcnow(), [f"gpu0@{NODE}", f"gpu1@{NODE}"]
    log_path = isolated.home / "launcher-test.log"
    with open(log_path, "ab") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker"], cwd=ROOT,
                                    env=isolated.environ(PYTHONPATH=str(tmp_path / "site")),
                                    stdout=log, stderr=subprocess.STDOUT)
    try:
        def beating() -> set[str]:
            assert launcher.poll() is None, f"launcher exited: {log_path.read_text()}"
            return alive_since(isolated.settings.database, names, since, 5.0)

        wait_until(beating, 180, f"workers {names} to beat", until=lambda a: a == set(names),
                   interval=0.5)
        yield isolated
    finally:
        stop(launcher)


def test_each_gpu_worker_runs_pinned_to_its_gpus_uuid(gpu_node: Stack) -> None:
    rows = {w["device"]: w for w in list_workers(gpu_node.settings.database, 5.0, NODE)}
    for index, uuid in enumerate(UUIDS):
        pid = rows[f"gpu:{index}"]["pid"]
        assert pid is not None
        env = environ_of(pid)
        assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env["MXQ_DEVICE"]) == (
            uuid, "PCI_BUS_ID", f"gpu:{index}")
    shown = {r["device"]: r for r in gpu_node.mxq_json("devices")}
    assert [(shown[f"gpu:{i}"]["uuid"], shown[f"gpu:{i}"]["cuda_visible_devices"])
            for i in range(2)] == [(u, u) for u in UUIDS]
    # A training on both, led by gpu:1: its child's contexts gpu(0), gpu(1) are gpu:1, gpu:0.
    env, cores = child_env(gpu_node.settings, ["gpu:1", "gpu:0"])
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], cores) == (
        f"{UUIDS[1]},{UUIDS[0]}", "PCI_BUS_ID", [])


def test_the_plan_pins_by_uuid_and_shows_it(tmp_path: Path) -> None:
    specs, refused = plan(Settings(node="box1", home=tmp_path),
                          parse_nvidia_smi(LISTING.read_text()), "mxnet-cu112")
    assert refused == []
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == list(UUIDS)
    assert [s.device.info()["cuda_visible_devices"] for s in specs if s.device] == list(UUIDS)


def test_a_listing_without_uuids_plans_pinned_by_index_in_bus_order(tmp_path: Path) -> None:
    """A listing without the uuid column (or a GPU whose UUID nvidia-smi cannot read) still
    plans: that GPU is pinned by its index, which CUDA counts in PCI bus order as nvidia-smi does."""
    text = "\n".join(", ".join(c for i, c in enumerate(line.split(", ")) if i != 1)
                     for line in LISTING.read_text().splitlines())
    gpus = parse_nvidia_smi(text)
    assert [g.uuid for g in gpus] == ["", ""]
    specs, refused = plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")
    assert refused == []
    assert [(s.env["CUDA_VISIBLE_DEVICES"], s.env["CUDA_DEVICE_ORDER"]) for s in specs] == [
        ("0", "PCI_BUS_ID"), ("1", "PCI_BUS_ID")]


def test_a_uuid_cuda_would_not_take_is_a_one_line_error() -> None:
    from mxq.workers.hardware.devices import DeviceError

    with pytest.raises(DeviceError) as bad:
        parse_nvidia_smi("index, uuid, name, memory.total [MiB], memory.used [MiB]\n"
                         "0, 5c1d9e2a 7b3f, X, 1 MiB, 1 MiB\n")
    assert str(bad.value) == (
        "nvidia-smi line 2 gives GPU UUID '5c1d9e2a 7b3f': expected GPU- and hexadecimal digits "
        "in dash-separated groups (GPU-8f6a3c1e-5b2d-...), which CUDA_VISIBLE_DEVICES takes; "
        "check the GPU with `nvidia-smi -q`")

