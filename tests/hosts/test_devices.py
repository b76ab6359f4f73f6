"""Device discovery and the MXNet-build check, on recorded nvidia-smi output."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxq.workers.hardware import devices as devices_module
from mxq.workers.hardware.devices import (
    DeviceError,
    discover,
    incompatibility,
    parse_nvidia_smi,
)
from mxq.workers.hardware.kernels import RECORDED, BuildKernels, read_kernels
from mxq.workers.launch.launcher import plan
from mxq.workers.settings import Settings
from tests.conftest import FIXTURES, ROOT, Stack, run_cli

SMI = FIXTURES / "nvidia-smi"


def _script(tmp_path: Path, body: str) -> Path:
    """An `nvidia-smi` stand-in running `body` (sh): the GPU cannot exist here."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return exe


def fake_nvidia_smi(tmp_path: Path, fixture: str) -> Path:
    """An `nvidia-smi` that prints recorded output."""
    return _script(tmp_path, f"cat '{SMI / fixture}'")


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
    assert message is not None
    assert "compute capability 9.0 = sm_90" in message and "sm_86" in message
    assert "no PTX" in message and "NVIDIA H200" in message
    a100 = parse_nvidia_smi((SMI / "a100x4.csv").read_text())[0]
    assert incompatibility(a100, "mxnet-cu112") is None
    assert "CPU-only build" in (incompatibility(a100, "mxnet") or "")


def test_gpu_workers_are_pinned_one_gpu_each(tmp_path: Path) -> None:
    settings = Settings(node="box1", home=tmp_path)
    gpus = parse_nvidia_smi((SMI / "mixed-a6000-h100.csv").read_text())
    specs, refused = plan(settings, gpus, "mxnet-cu112")
    assert [s.name for s in specs] == ["gpu0@box1"] and len(refused) == 1
    assert "gpu:1" in refused[0] and "sm_90" in refused[0]
    env = specs[0].env
    assert env["CUDA_VISIBLE_DEVICES"] == gpus[0].uuid and env["MXQ_DEVICE"] == "gpu:0"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-6b7c8d9e")  # pinned by UUID (issue 60)
    # MXNet runs it; ONNX Runtime's GPU build (gpu-onnx) is not installed in the test venv
    assert specs[0].queues == ["box1.gpu.0", "pool.gpu", "pool.gpu.mxnet"]
    assert specs[0].engines == ("mxnet",)
    cmd = specs[0].command
    assert cmd[cmd.index("--pool") + 1] == "solo" and cmd[cmd.index("-n") + 1] == "gpu0@box1"
    assert cmd[cmd.index("--prefetch-multiplier") + 1] == "1"


def test_cpu_workers_split_the_cores_and_see_no_gpu(tmp_path: Path) -> None:
    settings = Settings(node="box1", home=tmp_path)
    specs, _ = plan(settings, discover(str(tmp_path / "absent"), 2), "mxnet")
    for spec in specs:
        assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
        assert int(spec.env["OMP_NUM_THREADS"]) == len(spec.cores) >= 1
    pools = ["pool.cpu", "pool.cpu.mxnet", "pool.cpu.onnx"]
    assert [s.queues for s in specs] == [["box1.cpu.0", *pools], ["box1.cpu.1", *pools]]


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
    uuids = [g.uuid for g in parse_nvidia_smi((SMI / "a100x4.csv").read_text())]
    assert pins == {f"gpu{i}@box1": uuids[i] for i in range(4)}


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

    code = "import mxq.cli.main, sys; print('mxnet' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_container_seeing_one_gpu_keeps_its_host_index(tmp_path: Path) -> None:
    """As in docker-compose: the container of host GPU 1 sees it as its only GPU, index 0."""
    one = tmp_path / "one.csv"
    one.write_text("\n".join((SMI / "a100x4.csv").read_text().splitlines()[:2]) + "\n")
    exe = _script(tmp_path, f"cat '{one}'")
    settings = Settings(node="box1", home=tmp_path, host_gpus="1")
    (gpu,) = discover(str(exe), 2, settings.host_gpu_ids)
    specs, _ = plan(settings, [gpu], "mxnet-cu112")
    assert specs[0].name == "gpu1@box1" and specs[0].queues[0] == "box1.gpu.1"
    assert specs[0].env["CUDA_VISIBLE_DEVICES"] == gpu.uuid  # by UUID, which the container sees too


@pytest.mark.parametrize("sm, runs", [
    (50, True), (52, True), (53, True), (61, True), (62, True), (70, True), (72, True), (75, True),
    (80, True), (86, True), (87, True), (89, True), (35, False), (37, False), (90, False),
    (100, False), (120, False),
])
def test_the_cuda_compatibility_rule(sm: int, runs: bool) -> None:
    """SASS runs on its own major version at an equal or higher minor; there is no PTX to JIT."""
    assert RECORDED["mxnet-cu112"].runs_on(sm) is runs
    assert BuildKernels("x", sass=(80,), ptx=(70,)).runs_on(sm) is (sm >= 70)


def test_an_l40s_runs_and_an_h200_is_refused_with_what_to_do(tmp_path: Path) -> None:
    gpus = parse_nvidia_smi((SMI / "a100-l40s-h200.csv").read_text())
    assert [(g.name, g.compute_cap, g.driver_version, g.mig) for g in gpus] == [
        ("NVIDIA A100-SXM4-80GB", "8.0", "535.183.01", False), ("NVIDIA L40S", "8.9", "535.183.01", False),
        ("NVIDIA H200", "9.0", "535.183.01", False)]
    specs, refused = plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")
    assert [s.name for s in specs] == ["gpu0@box1", "gpu1@box1"]
    (message,) = refused
    assert message.startswith("gpu:2 (NVIDIA H200, compute capability 9.0 = sm_90) cannot run")
    assert "SASS for sm_50, sm_60, sm_70, sm_80, sm_86" in message and "no PTX" in message
    assert "MXNet trains on GPUs of compute capability 5.0 to 8.9" in message
    # what to do, for this GPU only (MXQ_NVIDIA_SMI=none, once advised, dropped the good GPUs too)
    assert message.endswith("ONNX Runtime (the gpu-onnx extra) can serve inference on this one; to "
                            "serve inference on it, install the gpu-onnx extra in an environment "
                            "of its own and set MXQ_ONNX_PYTHON to its python (docs/gpu-hosts.md)")
    assert "MXQ_NVIDIA_SMI" not in message


def test_every_placeholder_nvidia_smi_prints_parses() -> None:
    gpus = parse_nvidia_smi((SMI / "placeholders.csv").read_text())
    assert [(g.index, g.name, g.uuid, g.compute_cap) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", "GPU-8f6a3c1e-5b2d-4e7f-9a10-3c2b1d0e4f5a", ""),
        (1, "", "", ""), (2, "NVIDIA L40S", "GPU-4e5f6a7b-8c9d-4e0f-a1b2-c3d4e5f6a7b8", "8.9")]
    assert [(g.memory_total_mib, g.memory_used_mib) for g in gpus] == [(None, None), (None, None), (None, 1)]
    assert gpus[1].driver_version == "" and not any(g.mig for g in gpus)
    assert incompatibility(gpus[0], "mxnet-cu112") is None  # unknown capability: the worker finds out


@pytest.mark.parametrize("text, needle", [
    ("index, uuid, name, memory.total [MiB], memory.used [MiB]\n[N/A], GPU-1, X, 1 MiB, 1 MiB\n",
     "nvidia-smi line 2 gives GPU index '[N/A]'"),
    ("index, uuid, name, memory.total [MiB], memory.used [MiB]\n0, GPU-1, X, 1 MiB\n",
     "nvidia-smi line 2 has 4 fields, its header 5"),
])
def test_a_row_that_cannot_be_used_is_a_clear_error(text: str, needle: str) -> None:
    with pytest.raises(DeviceError, match=re.escape(needle)):
        parse_nvidia_smi(text)


def test_a_driver_without_compute_cap_is_asked_again(tmp_path: Path) -> None:
    exe = _script(tmp_path, 'case "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid '
                            'field to query.\'; exit 2;; esac\n'
                            f"cat '{SMI / 'driver-470-t4.csv'}'")
    (gpu,) = discover(str(exe), 2)
    assert (gpu.label, gpu.name, gpu.compute_cap) == ("gpu:0", "Tesla T4", "")
    assert gpu.driver_version == "470.223.02"
    specs, refused = plan(Settings(node="box1", home=tmp_path), [gpu], "mxnet-cu112")
    assert refused == [] and specs[0].env["MXNET_USE_FUSION"] == "0"  # R470 < R520 (NVRTC 11.8)


def test_fusion_stays_on_with_a_driver_nvrtc_11_8_supports(tmp_path: Path) -> None:
    gpus = parse_nvidia_smi((SMI / "a100-l40s-h200.csv").read_text())
    specs, _ = plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")
    assert all("MXNET_USE_FUSION" not in s.env for s in specs)


FAILING = "echo 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 18"


def test_a_failing_nvidia_smi_warns_then_cpu_devices_start(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    devices = discover(str(_script(tmp_path, FAILING)), 2)
    assert [d.label for d in devices] == ["cpu:0", "cpu:1"]
    (record,) = [r for r in caplog.records if "nvidia-smi failed" in r.getMessage()]
    assert "exited with 18: Failed to initialize NVML: Driver/library version mismatch" in record.getMessage()


def test_a_failing_nvidia_smi_is_an_error_where_gpus_are_expected(tmp_path: Path) -> None:
    with pytest.raises(DeviceError) as failed:
        discover(str(_script(tmp_path, FAILING)), 2, expect_gpus=True)
    message = str(failed.value)
    assert "--query-gpu=index,uuid,name,compute_cap" in message and "exited with 18" in message
    assert "Driver/library version mismatch" in message


def test_a_hanging_nvidia_smi_is_never_silent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(devices_module, "NVIDIA_SMI_TIMEOUT", 0.5)
    exe = str(_script(tmp_path, "exec sleep 30"))
    with pytest.raises(DeviceError, match="timed out: no answer in 0.5 s"):
        discover(exe, 2, expect_gpus=True)
    assert [d.label for d in discover(exe, 1)] == ["cpu:0"]
    assert any("timed out" in r.getMessage() for r in caplog.records)


def test_an_nvidia_smi_that_hangs_after_two_rows_plans_those_two(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 60: the timeout dropped what it printed (a hang while querying the third GPU lost the
    node's two good ones). A process of it that outlives the kill holds its output open, as one
    stuck in the driver would: `subprocess.run` waited for it."""
    monkeypatch.setattr(devices_module, "NVIDIA_SMI_TIMEOUT", 1.0)
    listing = (SMI / "a100x4.csv").read_text().splitlines()
    rows = "\n".join(listing[:3])
    exe = str(_script(tmp_path, f"printf '%s\\n' '{rows}'\nsleep 30 &\nexec sleep 30"))
    started = time.monotonic()
    gpus = discover(exe, 1, expect_gpus=True)
    assert time.monotonic() - started < 10  # bounded: never the hang's 30 s
    assert [g.label for g in gpus] == ["gpu:0", "gpu:1"]
    assert any("timed out" in r.getMessage() and "gpu:0" in r.getMessage() for r in caplog.records)


def test_expected_gpus_without_nvidia_smi_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="GPUs are expected"):
        discover(str(tmp_path / "absent"), 2, expect_gpus=True)


def test_a_mig_enabled_gpu_is_refused_with_how_to_use_it(tmp_path: Path) -> None:
    gpus = parse_nvidia_smi((SMI / "mig-a100.csv").read_text())
    specs, refused = plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")
    assert [s.name for s in specs] == ["gpu1@box1"]
    assert refused == ["gpu:0 (NVIDIA A100-SXM4-80GB) has MIG mode enabled: mxq pins whole GPUs, one "
                       "worker each; disable MIG (`nvidia-smi -i 0 -mig 0`, then reset the GPU) to use it"]


NO_MXNET = """
import sys
from fastapi.testclient import TestClient
from mxq.workers.broker.app import app as celery_app
from mxq.api.app import app
celery_app.loader.import_default_modules()  # what `celery -A mxq.workers worker` imports at start
client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
assert client.get("/api/v1/jobs").status_code == 200 and client.get("/metrics").status_code == 200
print(sorted(t for t in celery_app.tasks if t.startswith("mxq.")), "mxnet" in sys.modules)
"""


def test_the_schedule_process_and_the_api_never_load_mxnet(tmp_path: Path) -> None:
    """Only device workers (MXQ_DEVICE set by the launcher) import the job tasks and MXNet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
    env["MXQ_HOME"] = str(tmp_path)
    from mxq.db.migrate import upgrade

    upgrade(f"sqlite:///{tmp_path / 'mxq.db'}")
    control = subprocess.run([sys.executable, "-c", NO_MXNET], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
    tasks = ("['mxq.fire', 'mxq.hooks', 'mxq.openlineage', 'mxq.reconcile', 'mxq.retention', "
             "'mxq.tick'] False")
    assert control.stdout.strip() == tasks, control.stderr
    device = subprocess.run([sys.executable, "-c", NO_MXNET], cwd=ROOT, env={**env, "MXQ_DEVICE": "cpu:0"},
                            capture_output=True, text=True, timeout=120)
    assert device.stdout.strip() == ("['mxq.arch', 'mxq.fire', 'mxq.hooks', 'mxq.infer', "
                                     "'mxq.openlineage', 'mxq.probe', 'mxq.reconcile', "
                                     "'mxq.register', 'mxq.retention', 'mxq.tick', 'mxq.train'] "
                                     "True"), device.stderr


def _fatbin(entries: list[tuple[int, int]]) -> bytes:
    """A fat binary holding one entry (kind, sm) per item, each with a 16-byte body."""
    header = "<HHIQIIHHI"  # kind, flags, header size, body size, ..., minor, major, sm
    body = b"".join(struct.pack(header, kind, 0x101, 64, 16, 0, 0, sm % 10, sm // 10, sm).ljust(64, b"\0")
                    + bytes(16) for kind, sm in entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 file with the given sections (and the section-name table)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [".shstrtab", *sections])
    blobs = [names, *sections.values()]
    data, offsets, at = b"", [], 64
    for blob in blobs:
        offsets.append(at + len(data))
        data += blob
    headers = bytes(64)  # the null section
    name_at = 1
    for blob, offset, name in zip(blobs, offsets, [".shstrtab", *sections], strict=True):
        headers += struct.pack("<IIQQQQIIQQ", name_at, 1, 0, 0, offset, len(blob), 0, 0, 8, 0)
        name_at += len(name) + 1
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", head, 0x28, 64 + len(data))
    struct.pack_into("<HHH", head, 0x3A, 64, len(blobs) + 1, 1)
    return bytes(head) + data + headers


def test_the_kernels_of_a_library_are_read_from_its_fat_binaries(tmp_path: Path) -> None:
    library = tmp_path / "libfake.so"
    fatbins = _fatbin([(2, 75), (2, 80)]) + bytes(8) + _fatbin([(1, 80), (2, 80)])
    library.write_bytes(_elf({".text": b"\x90" * 40, ".nv_fatbin": fatbins}))
    kernels = read_kernels(library, "0.1")
    assert kernels == BuildKernels("0.1", sass=(75, 80), ptx=(80,))
    assert kernels.runs_on(90) and kernels.runs_on(86) and not kernels.runs_on(70)
    plain = tmp_path / "libplain.so"
    plain.write_bytes(_elf({".text": b"\x90" * 40}))
    assert read_kernels(plain) is None


def _visible_plan(tmp_path: Path, visible: str) -> tuple[int, str, dict]:
    env = {"MXQ_HOME": str(tmp_path), "MXQ_NODE": "box1", "MXQ_MXNET_BUILD": "mxnet-cu112",
           "MXQ_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path, "a100x4.csv")),
           "CUDA_VISIBLE_DEVICES": visible}
    proc = run_cli(["worker", "--dry-run", "--json"], env)
    return proc.returncode, proc.stderr, json.loads(proc.stdout) if proc.stdout else {}


@pytest.mark.parametrize(("visible", "workers"), [
    ("1", ["gpu1@box1"]),
    ("3,1", ["gpu3@box1", "gpu1@box1"]),  # in the order given
    ("GPU-1a2b3c4d, 2", ["gpu1@box1", "gpu2@box1"]),  # a UUID prefix, spaces around
    ("0,-1,2", ["gpu0@box1"]),  # CUDA stops at the first negative entry
])
def test_cuda_visible_devices_is_the_set_of_gpus_mxq_may_use(tmp_path: Path, visible: str,
                                                            workers: list[str]) -> None:
    """`CUDA_VISIBLE_DEVICES=1 mxq worker --dry-run` once planned every GPU and overwrote it."""
    code, err, out = _visible_plan(tmp_path, visible)
    assert code == 0, err
    assert [w["worker"] for w in out["workers"]] == workers
    uuids = [g.uuid for g in parse_nvidia_smi((SMI / "a100x4.csv").read_text())]
    assert [w["env"]["CUDA_VISIBLE_DEVICES"] for w in out["workers"]] == [
        uuids[int(w[3])] for w in workers]  # each worker still pinned to its own one GPU


@pytest.mark.parametrize("visible", ["", "-1"])
def test_no_visible_gpu_means_cpu_devices(tmp_path: Path, visible: str) -> None:
    code, err, out = _visible_plan(tmp_path, visible)
    assert code == 0, err
    assert {w["device"].split(":")[0] for w in out["workers"]} == {"cpu"}


@pytest.mark.parametrize(("visible", "said"), [
    ("7", "CUDA_VISIBLE_DEVICES='7': '7' is no GPU of this host; nvidia-smi shows 0 (GPU-8f6a3c1e"),
    ("1,1", "CUDA_VISIBLE_DEVICES='1,1' names GPU 1 twice"),
    ("GPU-", "'GPU-' matches several GPUs"),
    ("x" * 500, "'xxxxxxxxxx"),
])
def test_a_cuda_visible_devices_naming_no_gpu_here_is_one_line(tmp_path: Path, visible: str,
                                                               said: str) -> None:
    code, err, _ = _visible_plan(tmp_path, visible)
    assert code != 0 and said in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and len(err) < 600


LOST_ONE = (f"cat '{SMI / 'a100-l40s-h200.csv'}' | head -3\n"
            "echo 'Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error'\n"
            "exit 15")


@pytest.mark.parametrize("expect_gpus", [False, True])
def test_a_lost_gpu_leaves_the_others_listed_running(tmp_path: Path, expect_gpus: bool,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """nvidia-smi prints the healthy rows, then the lost GPU's error, and exits non-zero: the
    listed GPUs start (it was "nvidia-smi failed on a host with GPUs" for every GPU of the node,
    and a restart loop under compose), and the warning names the failure."""
    listed = parse_nvidia_smi((SMI / "a100-l40s-h200.csv").read_text())[:2]
    found = discover(str(_script(tmp_path, LOST_ONE)), 2, expect_gpus=expect_gpus)
    assert [(g.label, g.uuid) for g in found] == [(g.label, g.uuid) for g in listed]
    (record,) = [r for r in caplog.records if "after listing" in r.getMessage()]
    assert "exited with 15" in record.getMessage() and "0000:3B:00.0: Unknown Error" in record.getMessage()


def test_only_the_old_drivers_error_asks_again_without_compute_cap(tmp_path: Path) -> None:
    """Any failure whose output mentioned compute_cap (the header it printed before failing) was
    retried with the old fields, and the error then named the retried command and its output."""
    exe = _script(tmp_path, 'case "$*" in *compute_cap*) echo "index, uuid, name, compute_cap"; '
                            'echo "NVML: GPU is lost" >&2; exit 15;; '
                            "esac\necho 'asked without compute_cap' >&2; exit 99")
    with pytest.raises(DeviceError) as failed:
        discover(str(exe), 2, expect_gpus=True)
    assert "exited with 15: NVML: GPU is lost" in str(failed.value)
    assert "compute_cap" in str(failed.value)  # the command that failed, as it was run


def test_engine_figures_are_kept_per_gpu_model(tmp_path: Path) -> None:
    """An A100 and an L40S in one host: each worker is told its GPU's model, and a version's
    figures measured on each decide for that model only (they were keyed "gpu": the first GPU
    model measured decided for every other)."""
    from mxq.engines import choose, figures_key

    gpus = parse_nvidia_smi((SMI / "a100-l40s-h200.csv").read_text())
    specs, _ = plan(Settings(node="box1", home=tmp_path), gpus, "mxnet-cu112")
    models = [s.env["MXQ_DEVICE_MODEL"] for s in specs]
    assert models == ["NVIDIA A100-SXM4-80GB (8.0)", "NVIDIA L40S (8.9)"]
    keys = [figures_key("gpu", m) for m in models]
    assert keys == ["gpu:NVIDIA A100-SXM4-80GB (8.0)", "gpu:NVIDIA L40S (8.9)"]
    assert figures_key("cpu", None) == "cpu" and figures_key("gpu", None) == "gpu"
    agrees = {"file": "m.onnx", "max_diff": 1e-6, "argmax_agreement": 1.0}
    engines = {keys[0]: {"mxnet": 900.0, "onnx": 300.0}, keys[1]: {"mxnet": 200.0, "onnx": 800.0}}
    assert [choose("auto", agrees, engines[k]).engine for k in keys] == ["mxnet", "onnx"]


def test_a_gpu_whose_memory_another_process_holds_is_refused_naming_it(tmp_path: Path) -> None:
    """memory.used was parsed and never looked at: a GPU a stranger's process held got a
    worker, which then ran out of memory at every job."""
    from dataclasses import replace

    gpus = parse_nvidia_smi((SMI / "a100-l40s-h200.csv").read_text())[:2]
    held = [gpus[0], replace(gpus[1], memory_used_mib=30000)]
    specs, refused = plan(Settings(node="box1", home=tmp_path), held, "mxnet-cu112")
    assert [s.name for s in specs] == ["gpu0@box1"]  # 4 MiB in use: an idle GPU
    assert refused == ["gpu:1 (NVIDIA L40S): 30000 MiB of its 46068 MiB are in use by other processes "
                       "(more than 50%); see `nvidia-smi` for which, and start mxq on it once they "
                       "end (or hide it with CUDA_VISIBLE_DEVICES)"]
