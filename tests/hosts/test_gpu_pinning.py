"""Each GPU worker is pinned by its GPU's UUID (issue 60, item 7): CUDA counts GPUs fastest
first unless told otherwise, NVML and nvidia-smi in PCI bus order, so `CUDA_VISIBLE_DEVICES=1`
could be another GPU than nvidia-smi's gpu:1. With the UUID the worker's context 0 is that exact
GPU; a training child gets its K devices' UUIDs, in order. And each GPU's compute mode
(issue 60, item 6): under Exclusive_Process one process alone may hold the GPU, its worker, so a
training there fails at once with why (or goes back to its pool for GPUs that can run it).

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

from mxq.db.fleet import alive_since, list_workers, register
from mxq.db.schema import utcnow
from mxq.tasks.job_context import JobInputError
from mxq.tasks.training.train_task import child_env, choose_devices, exclusive_reason
from mxq.workers.hardware.devices import DeviceError, parse_nvidia_smi
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.jobs.submit import submit
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


def launch_stand_ins(stack: Stack, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`mxq worker` on the stack, its GPU workers computing on CPUs (STAND_IN as their
    sitecustomize): the launcher and its log."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(STAND_IN)
    log_path = stack.home / "launcher-test.log"
    with open(log_path, "ab") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker"], cwd=ROOT,
                                    env=stack.environ(PYTHONPATH=str(tmp_path / "site")),
                                    stdout=log, stderr=subprocess.STDOUT)
    return launcher, log_path


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
    isolated.env.update(MXQ_NVIDIA_SMI=str(smi), MXQ_MXNET_BUILD="mxnet-cu112")
    since, names = utcnow(), [f"gpu0@{NODE}", f"gpu1@{NODE}"]
    launcher, log_path = launch_stand_ins(isolated, tmp_path)
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
    assert [(shown[f"gpu:{i}"]["uuid"], shown[f"gpu:{i}"]["cuda_visible_devices"],
             shown[f"gpu:{i}"]["compute_mode"]) for i in range(2)] == [
        (UUIDS[0], UUIDS[0], "Default"), (UUIDS[1], UUIDS[1], "Exclusive_Process")]
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
    with pytest.raises(DeviceError) as bad:
        parse_nvidia_smi("index, uuid, name, memory.total [MiB], memory.used [MiB]\n"
                         "0, 5c1d9e2a 7b3f, X, 1 MiB, 1 MiB\n")
    assert str(bad.value) == (
        "nvidia-smi line 2 gives GPU UUID '5c1d9e2a 7b3f': expected GPU- and hexadecimal digits "
        "in dash-separated groups (GPU-8f6a3c1e-5b2d-...), which CUDA_VISIBLE_DEVICES takes; "
        "check the GPU with `nvidia-smi -q`")



def test_a_training_on_an_exclusive_process_gpu_fails_with_why(gpu_node: Stack) -> None:
    """Sent to gpu:1's own queue: its child could never get a context beside its worker's (it
    failed with a CUDA error after the leases and the wait); now it fails at once, in one line."""
    s = gpu_node.settings
    sent = submit(s, "train", {"arch": "mlp", "dataset": "digits", "name": "excl", "epochs": 1}, "gpu:1")
    job = gpu_node.wait(sent, timeout=120)
    assert job["status"] == "failed" and job["error"] == exclusive_reason(["gpu:1"]), job
    assert job["error"] == (
        "gpu:1 is in the Exclusive_Process compute mode, where one process alone may use a GPU: "
        "its worker does, so no training process can start there (inference and probes run in "
        "the worker and are served); set the Default compute mode (`nvidia-smi -i 1 -c DEFAULT`) "
        "to train on it")


def _rows(stack: Stack, *modes: str) -> Settings:
    """gpu:i an A100 in compute mode `modes[i]`, each running MXNet and beating."""
    s = stack.settings
    for index, mode in enumerate(modes):
        register(s.database, f"gpu{index}@{NODE}", NODE, f"gpu:{index}", f"{NODE}.gpu.{index}",
                 None, {"name": "NVIDIA A100-SXM4-80GB", "compute_mode": mode}, engines=("mxnet",))
    return s.model_copy(update={"nvidia_smi": str(stack.home / "absent")})


def test_an_exclusive_gpu_hands_a_pool_training_back_and_is_no_partner(isolated: Stack) -> None:
    s = _rows(isolated, "Default", "Exclusive_Process", "Default")
    one = TrainParams(arch="mlp", dataset="digits", name="x", epochs=1)
    with pytest.raises(LookupError, match="^gpu:1 cannot train"):
        choose_devices(s, one, "gpu:1", movable=True)  # gpu:0 or gpu:2 takes it from the pool
    with pytest.raises(JobInputError, match=r"^gpu:1 is in the Exclusive_Process compute mode"):
        choose_devices(s, one, "gpu:1")  # its own queue: only it may run the job
    two = TrainParams(arch="mlp", dataset="digits", name="x", epochs=1, devices=2)
    assert choose_devices(s, two, "gpu:0") == ["gpu:0", "gpu:2"]  # never gpu:1, the lower index
    three = TrainParams(arch="mlp", dataset="digits", name="x", epochs=1, devices=3)
    with pytest.raises(JobInputError, match="^3 devices asked but node testnode has 2 gpu devices"):
        choose_devices(s, three, "gpu:0")


def test_compute_modes_parse_and_a_prohibited_gpu_is_refused(tmp_path: Path) -> None:
    gpus = parse_nvidia_smi(LISTING.read_text().replace("Exclusive_Process", "Prohibited"))
    specs, refused = plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")
    assert [s.name for s in specs] == ["gpu0@box1"]
    assert refused == ["gpu:1 (NVIDIA A100-SXM4-80GB) is in the Prohibited compute mode: no process "
                       "may use it; set the Default compute mode (`nvidia-smi -i 1 -c DEFAULT`) to use it"]
    with pytest.raises(DeviceError) as bad:
        parse_nvidia_smi(LISTING.read_text().replace("Exclusive_Process", "Shared"))
    assert str(bad.value) == ("nvidia-smi line 3 gives compute mode 'Shared': expected one of Default, "
                              "Exclusive_Process, Exclusive_Thread, Prohibited; check the GPU with "
                              "`nvidia-smi -q -d COMPUTE`")
    old = parse_nvidia_smi((SMI / "a100x4.csv").read_text())  # a listing without the column
    assert {g.compute_mode for g in old} == {""} and "compute_mode" not in old[0].info()
