"""What the GPU already says (issue 60, item 7), with real workers and a fake NVML: the CPU
workers stand in for GPUs, each reading the fake `pynvml` of tests/fixtures/nvml (put first on
their PYTHONPATH) as its GPU, through a `sitecustomize` that makes a CPU device's worker read
NVML device 0 (a GPU worker reads its own CUDA_VISIBLE_DEVICES). An Xid 79 takes its device out
and its job goes back to the queue without an attempt; an Xid 13 (the application's) does not;
a pending row remap takes its device out and keeps it out, probe after probe, until cleared."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import pytest
from rich.console import Console

from mxq.api.metrics import render_metrics
from mxq.cli import render
from mxq.db import jobs
from mxq.db.events import list_events
from mxq.db.webhooks import endpoints, outbox
from mxq.json_types import JsonObject
from mxq.workers.fleet.device_table import device_table
from mxq.workers.jobs.submit import submit
from tests.conftest import FIXTURES, NODE, Stack, launch, stop, wait_until

pytestmark = pytest.mark.slow

SITECUSTOMIZE = '''
import os
if os.environ.get("MXQ_TEST_NVML") and os.environ.get("MXQ_DEVICE"):
    from mxq.workers.fleet import nvml
    nvml.target = lambda kind, visible: 0  # a CPU worker reads the fake GPU 0 as its own
'''
GPU = {"memory_used_mib": 1234, "memory_total_mib": 24000, "ecc_uncorrected": 0,
       "row_remap_pending": False, "row_remap_failed": False, "clocks": 0x1 | 0x8, "xids": []}
HOLD = {"size": 512, "batch": 8, "repeat": 10_000}  # a probe that runs until cancelled


def _fake_nvml(tmp: Path, reprobe: str) -> dict[str, str]:
    """The environment of workers reading the fake NVML, each device's GPU as `GPU` says."""
    (tmp / "site").mkdir()
    (tmp / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp / "nvml").mkdir()
    for device in ("cpu0", "cpu1"):
        _gpu(tmp, device, **GPU)
    path = os.pathsep.join([str(FIXTURES / "nvml"), str(tmp / "site")])
    return {"PYTHONPATH": path, "MXQ_TEST_NVML": str(tmp / "nvml"), "MXQ_REPROBE_SECONDS": reprobe}


def _gpu(tmp: Path, device: str, **state: object) -> None:
    """Rewrite the fake GPU of `device` (`cpu1`), atomically: its worker reads it at each call."""
    path = tmp / "nvml" / f"{device}.json"
    was = json.loads(path.read_text()) if path.exists() else {}
    path.with_suffix(".tmp").write_text(json.dumps({**was, **state}))
    path.with_suffix(".tmp").replace(path)


def _xid(tmp: Path, device: str, xid: int) -> None:
    was = json.loads((tmp / "nvml" / f"{device}.json").read_text())
    _gpu(tmp, device, xids=[*was["xids"], xid])


def _row(stack: Stack, device: str) -> JsonObject:
    return next(r for r in device_table(stack.settings) if r["device"] == device)


def _nvml(stack: Stack, device: str) -> dict:
    read = _row(stack, device).get("nvml")
    return read if isinstance(read, dict) else {}


def _metrics(stack: Stack) -> dict[str, float]:
    text = render_metrics(stack.settings)[0].decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("mxq_device_")}


def _told(stack: Stack, hook: int, event: str) -> list[dict]:
    return [d["payload"]["device"] for d in outbox.list_deliveries(stack.settings.database, hook)
            if d["event"] == event]


@pytest.mark.timeout(600)
def test_an_xid_79_takes_its_device_out_and_requeues_its_job_and_an_xid_13_does_not(
        isolated: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = isolated.settings.database
    hook = endpoints.add_hook(url, "https://hooks.example.com/in", ["device.out"], "admin")["id"]
    launcher = launch(isolated, **_fake_nvml(tmp_path, reprobe="3600"))  # out stays out here
    try:
        for device in ("cpu:0", "cpu:1"):  # the live memory reaches the device table
            wait_until(partial(_nvml, isolated, device), 60, f"{device}'s NVML reading",
                       until=lambda read: read.get("memory_used_mib") == 1234)
        job_id = submit(isolated.settings, "probe", HOLD)
        job = isolated.wait(job_id, until=("running",))
        busy = str(job["device"])
        idle = "cpu:1" if busy == "cpu:0" else "cpu:0"
        pid = _row(isolated, idle)["pid"]

        _xid(tmp_path, idle.replace(":", ""), 13)  # the application's: the GPU stays in service
        read = wait_until(lambda: _nvml(isolated, idle), 60, "the Xid 13 to be read",
                          until=lambda r: r.get("xids") == [13])
        assert (read["health"], read["reason"]) == ("ok", None)

        _gpu(tmp_path, busy.replace(":", ""), memory_used_mib=20480)
        _xid(tmp_path, busy.replace(":", ""), 79)  # fallen off the bus, under the running job
        out = wait_until(lambda: _row(isolated, busy), 60, f"{busy} to go out",
                         until=lambda r: r["health"] == "out")
        assert "NVML reported critical Xid 79 (GPU has fallen off the bus)" in str(out["out_reason"])
        assert out["memory_used_mib"] == 20480  # NVML's live figure, not nvidia-smi's at planning
        done = isolated.job(job_id)
        assert done["device_faults"] == 1 and done["attempts"] == 1, done
        said = [e["message"] for e in list_events(url, job_id) if e["kind"] == "device-fault"]
        assert len(said) == 1 and f"device fault on {busy} during job {job_id}: NVML reported " \
            "critical Xid 79" in said[0], said
        still = _row(isolated, idle)
        assert (still["health"], still["pid"]) == ("healthy", pid)  # the Xid 13 left it alone

        told = _told(isolated, hook, "device.out")
        assert [t["device"] for t in told] == [busy], told
        assert "Xid 79" in told[0]["reason"] and told[0]["nvml"]["health"] == "fault"
        assert told[0]["nvml"]["reason"] == "NVML reported critical Xid 79 (GPU has fallen off the bus)"
        assert told[0]["nvml"]["memory_used_mib"] == 20480

        listed = isolated.mxq("devices", "--json")
        rows = {r["device"]: r for r in json.loads(listed.stdout)}
        assert rows[busy]["nvml"]["health"] == "fault" and rows[idle]["nvml"]["health"] == "ok"
        assert rows[idle]["nvml"]["xids"] == [13] and rows[idle]["memory_used_mib"] == 1234
        assert rows[idle]["nvml"]["clock_event_reasons"] == ["gpu_idle", "hw_slowdown"]
        monkeypatch.setattr(render, "out", Console(width=400))  # one line a row, however long
        shown = isolated.mxq("devices").stdout
        assert "fault: NVML reported critical Xid 79" in shown and "clocks: hw_slowdown" in shown

        values = _metrics(isolated)
        at = {d: f'device="{d}",node="{NODE}"' for d in (busy, idle)}
        assert values[f"mxq_device_nvml_healthy{{{at[busy]}}}"] == 0.0
        assert values[f"mxq_device_nvml_healthy{{{at[idle]}}}"] == 1.0
        assert values[f"mxq_device_memory_used_bytes{{{at[idle]}}}"] == 1234 * 2.0**20
        assert values[f"mxq_device_memory_total_bytes{{{at[idle]}}}"] == 24000 * 2.0**20
        faults = [k for k in values if k.startswith("mxq_device_nvml_fault{")]
        assert faults == [f'mxq_device_nvml_fault{{{at[busy]},reason="NVML reported critical Xid '
                          f'79 (GPU has fallen off the bus)"}}'], faults
        assert values[f'mxq_device_clock_event_reason{{{at[idle]},reason="hw_slowdown"}}'] == 1.0
        jobs.cancel(url, job_id)
    finally:
        stop(launcher)


@pytest.mark.timeout(600)
def test_a_pending_row_remap_keeps_its_device_out_until_nvml_says_it_is_clear(
        isolated: Stack, tmp_path: Path) -> None:
    """The launcher's probe is a small matmul, which a GPU with a remap pending passes: the
    worker's start check asks NVML too, and refuses the device while the remap waits."""
    url = isolated.settings.database
    hook = endpoints.add_hook(url, "https://hooks.example.com/in", ["device.out", "device.back"],
                              "admin")["id"]
    launcher = launch(isolated, **_fake_nvml(tmp_path, reprobe="0.5"))
    try:
        wait_until(lambda: _nvml(isolated, "cpu:1"), 60, "cpu:1's NVML reading", until=bool)
        _gpu(tmp_path, "cpu1", row_remap_pending=True)
        out = wait_until(lambda: _row(isolated, "cpu:1"), 60, "cpu:1 to go out",
                         until=lambda r: r["health"] == "out")
        assert "NVML reports a row remap pending" in str(out["out_reason"])
        # Probed again (its worker started anew) and refused by NVML, not passed on the matmul.
        again = wait_until(lambda: _row(isolated, "cpu:1"), 60, "a probe to refuse it again",
                           until=lambda r: str(r["out_reason"]).startswith("worker for cpu:1: "))
        assert again["health"] == "out" and "row remap pending" in str(again["out_reason"])
        assert again["out_since"] == out["out_since"]
        log = (isolated.home / "logs" / f"cpu1-{NODE}.log").read_text(errors="replace")
        assert "it stays out until NVML says it is clear" in log
        assert _row(isolated, "cpu:0")["health"] == "healthy"

        _gpu(tmp_path, "cpu1", row_remap_pending=False)  # a GPU reset applied it
        wait_until(lambda: _row(isolated, "cpu:1"), 120, "cpu:1 to come back",
                   until=lambda r: r["health"] == "healthy")
        back = _nvml(isolated, "cpu:1")
        assert back["health"] == "ok" and back["row_remap_pending"] is False
        told = _told(isolated, hook, "device.back")
        assert len(told) == 1 and "row remap pending" in told[0]["out_reason"], told
        assert told[0]["nvml"]["health"] == "ok" and told[0]["nvml"]["memory_used_mib"] == 1234
        assert [t["nvml"]["row_remap_pending"] for t in _told(isolated, hook, "device.out")] == [True]
    finally:
        stop(launcher)
