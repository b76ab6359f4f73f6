"""GPUs refused at planning and GPUs nvidia-smi no longer lists (issue 60, item 6): they had no
row, no metric, no webhook and no second look. Each is now `out` with why in `mxq devices` (text
and --json), the API's records and `/metrics`; `device.out` is told once per outage (a launcher
that starts again, as Compose restarts one, tells nothing new); the launcher plans them again on
its probe cadence and starts the worker of one that became usable, which tells `device.back`.
MXQ_EXPECTED_GPUS names a missing GPU: by index, and by the UUID this node's row remembers.

No GPU exists here: nvidia-smi is a recorded listing the test rewrites (memory freed, the lost
GPU listed again), and the `sitecustomize` of the pinning tests makes each GPU worker's MXNet
count one GPU and compute on the CPU, so the real launcher's real workers pass their start check.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from mxq.api.metrics import render_metrics
from mxq.api.schemas import DeviceRecord
from mxq.cli import render
from mxq.db import fleet
from mxq.db.schema import utcnow
from mxq.db.webhooks import endpoints, outbox
from mxq.json_types import JsonObject
from mxq.workers.fleet.device_table import device_table
from mxq.workers.hardware.devices import parse_nvidia_smi
from mxq.workers.hardware.unplanned import missing_gpus
from mxq.workers.launch.recheck import NodePlan, Recheck, node_plan
from mxq.workers.settings import Settings
from tests.conftest import FIXTURES, NODE, Stack, run_cli, stop, wait_until
from tests.hosts.test_gpu_pinning import launch_stand_ins

SMI = FIXTURES / "nvidia-smi"
WHOLE, PART = SMI / "a100x3.csv", SMI / "a100x2-of-3-busy.csv"
LOST_UUID = "GPU-71d0e6a2-9b5c-4e27-8f3a-d64c2b1e90a8"  # gpu:2's, as a100x3.csv lists it


def _smi(tmp_path: Path, listing: Path) -> tuple[Path, Path]:
    """A fake nvidia-smi printing a listing the test may replace, and that listing's path."""
    current = tmp_path / "listing.csv"
    shutil.copy(listing, current)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat '{current}'\n")
    smi.chmod(0o755)
    return smi, current


def test_an_expected_count_names_the_gpus_nvidia_smi_does_not_list() -> None:
    gpus = parse_nvidia_smi(WHOLE.read_text())
    assert missing_gpus(gpus, 3) == [] and missing_gpus(gpus, None) == []
    (fourth,) = missing_gpus(gpus, 4)
    assert (fourth.device.label, fourth.cause) == ("gpu:3", "missing")
    assert fourth.reason.startswith("gpu:3 is missing: nvidia-smi lists 3 GPUs, 4 expected "
                                    "(MXQ_EXPECTED_GPUS)")
    holed = [gpus[0], gpus[2]]  # gpu:1 gone from between the others
    assert [m.device.label for m in missing_gpus(holed, 4)] == ["gpu:1", "gpu:3"]


def test_the_plan_says_which_gpus_it_holds_and_why(tmp_path: Path) -> None:
    smi, _ = _smi(tmp_path, PART)
    s = Settings(node="box1", home=tmp_path, nvidia_smi=str(smi), expected_gpus=3,
                 mxnet_build="mxnet-cu112")
    node = node_plan(s)
    assert [w.name for w in node.specs] == ["gpu0@box1"]
    assert [(u.device.label, u.cause) for u in node.unplanned] == [("gpu:1", "memory_in_use"),
                                                                   ("gpu:2", "missing")]
    assert node.refused[0].startswith("gpu:1 (NVIDIA A100-SXM4-80GB): 61440 MiB of its 81920 MiB")
    mig = replace(parse_nvidia_smi(WHOLE.read_text())[0], mig=True)
    from mxq.workers.launch.launcher import plan_devices

    assert [u.cause for u in plan_devices(s, [mig], "mxnet-cu112")[1]] == ["mig"]


def test_a_held_gpu_is_told_out_once_across_launcher_starts(isolated: Stack, tmp_path: Path) -> None:
    """The launcher records its held GPUs at each start; one Compose restarts records them again,
    and must not tell `device.out` again (it did, for a node whose devices were all out)."""
    url = isolated.settings.database
    hook = endpoints.add_hook(url, "https://hooks.example.com/in", ["device.out"], "admin")["id"]
    smi, _ = _smi(tmp_path, PART)
    s = replace_settings(isolated, smi)
    for _ in range(3):  # three launcher starts
        Recheck(s, node_plan(s)).record()
    told = sorted((d["payload"]["device"] for d in outbox.list_deliveries(url, hook)),
                  key=lambda d: d["device"])
    assert [(t["device"], t["unplanned"]) for t in told] == [("gpu:1", "memory_in_use"),
                                                             ("gpu:2", "missing")]
    assert "61440 MiB" in told[0]["reason"] and told[1]["since"]


def replace_settings(stack: Stack, smi: Path, **more: str) -> Settings:
    stack.env.update(MXQ_NVIDIA_SMI=str(smi), MXQ_MXNET_BUILD="mxnet-cu112", MXQ_EXPECTED_GPUS="3",
                     **more)
    return stack.settings


@pytest.fixture
def held_node(isolated: Stack, tmp_path: Path) -> Iterator[tuple[Stack, Path, int]]:
    """`mxq worker` on a host of three A100s listing two, the second's memory held by another
    process: gpu:0's worker beats, gpu:1 and gpu:2 are out. gpu:2 was seen before (its row
    remembers its UUID). Yields the stack, the listing to rewrite and a webhook's id."""
    smi, listing = _smi(tmp_path, PART)
    replace_settings(isolated, smi, MXQ_REPROBE_SECONDS="1")
    url = isolated.settings.database
    fleet.register(url, f"gpu2@{NODE}", NODE, "gpu:2", f"{NODE}.gpu.2", None,
                   {"uuid": LOST_UUID, "name": "NVIDIA A100-SXM4-80GB"}, alive=False)
    hook = endpoints.add_hook(url, "https://hooks.example.com/in", ["device.out", "device.back"],
                              "admin")["id"]
    launcher, _ = launch_stand_ins(isolated, tmp_path)
    try:
        yield isolated, listing, hook
    finally:
        stop(launcher)


def _rows(stack: Stack) -> dict[str, dict]:
    return {str(r["device"]): r for r in device_table(stack.settings)}


def _told(stack: Stack, hook: int, event: str) -> dict[str, dict]:
    return {d["payload"]["device"]["device"]: d["payload"]["device"]
            for d in outbox.list_deliveries(stack.settings.database, hook) if d["event"] == event}


@pytest.mark.timeout(600)
def test_refused_and_missing_gpus_show_out_and_come_back_when_usable(
        held_node: tuple[Stack, Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    stack, listing, hook = held_node
    since = utcnow()
    wait_until(lambda: _rows(stack), 180, "gpu:0 to beat and gpu:1, gpu:2 to be out",
               until=lambda r: r.get("gpu:0", {}).get("alive") and
               all(r.get(d, {}).get("health") == "out" for d in ("gpu:1", "gpu:2")), interval=0.5)
    rows = _rows(stack)
    busy, lost = rows["gpu:1"], rows["gpu:2"]
    assert (busy["unplanned"], lost["unplanned"]) == ("memory_in_use", "missing")
    assert "61440 MiB of its 81920 MiB are in use" in busy["out_reason"]
    assert busy["memory_used_mib"] == 61440 and busy["compute_mode"] == "Default"
    assert lost["out_reason"].startswith(f"gpu:2 ({LOST_UUID}, NVIDIA A100-SXM4-80GB when last "
                                         "seen) is missing: nvidia-smi lists 2 GPUs, 3 expected")
    for row in rows.values():
        DeviceRecord.model_validate(row)  # what GET /api/v1/devices answers with
    _shows_them(stack, monkeypatch)
    told = _told(stack, hook, "device.out")
    assert set(told) == {"gpu:1", "gpu:2"} and told["gpu:2"]["unplanned"] == "missing"

    shutil.copy(WHOLE, listing)  # the memory freed, the lost GPU back in the listing
    wait_until(lambda: fleet.alive_since(stack.settings.database, [f"gpu1@{NODE}", f"gpu2@{NODE}"],
                                         since, 5.0), 240, "gpu:1 and gpu:2's workers to beat",
               until=lambda a: len(a) == 2, interval=0.5)
    rows = _rows(stack)
    assert all(rows[d]["health"] == "healthy" and not rows[d].get("unplanned")
               for d in ("gpu:1", "gpu:2")), rows
    assert rows["gpu:2"]["uuid"] == LOST_UUID and rows["gpu:1"]["memory_used_mib"] == 4
    back = wait_until(lambda: _told(stack, hook, "device.back"), 30, "device.back for both",
                      until=lambda b: set(b) == {"gpu:1", "gpu:2"})
    assert back["gpu:1"]["unplanned"] == "memory_in_use" and "61440 MiB" in back["gpu:1"]["out_reason"]
    assert back["gpu:2"]["unplanned"] == "missing"
    assert len(outbox.list_deliveries(stack.settings.database, hook)) == 4  # out and back, once each


def _shows_them(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """`mxq devices` (text and --json) and `/metrics` say which GPU is held and why."""
    monkeypatch.setattr(render, "out", Console(width=600))
    shown = run_cli(["devices"], stack.env)
    assert shown.returncode == 0, shown.stderr
    lines = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines()
             if line.count("│") > 2 and "gpu:" in line}
    assert "out (refused at planning: memory_in_use) since" in lines["gpu:1"], shown.stdout
    assert "out (missing) since" in lines["gpu:2"] and LOST_UUID in lines["gpu:2"], shown.stdout
    listed = {r["device"]: r for r in json.loads(run_cli(["devices", "--json"], stack.env).stdout)}
    assert (listed["gpu:1"]["health"], listed["gpu:1"]["unplanned"]) == ("out", "memory_in_use")
    assert listed["gpu:2"]["unplanned"] == "missing" and listed["gpu:0"].get("unplanned") is None
    text = render_metrics(stack.settings)[0].decode()
    for device, cause in (("gpu:1", "memory_in_use"), ("gpu:2", "missing")):
        assert f'mxq_device_unplanned{{cause="{cause}",device="{device}",node="{NODE}"}} 1.0' in text
        assert f'mxq_device_healthy{{device="{device}",node="{NODE}"}} 0.0' in text
    assert 'mxq_device_unplanned{cause' in text and 'device="gpu:0",node' not in text.split(
        "mxq_device_unplanned")[-1]


def test_dry_run_lists_the_held_gpus_with_their_cause(tmp_path: Path, isolated: Stack) -> None:
    smi, _ = _smi(tmp_path, PART)
    replace_settings(isolated, smi)
    shown = run_cli(["worker", "--dry-run", "--json"], isolated.env)
    said = json.loads(shown.stdout)
    assert [(u["device"], u["cause"]) for u in said["unplanned"]] == [("gpu:1", "memory_in_use"),
                                                                      ("gpu:2", "missing")]
    assert len(said["refused"]) == 2 and [w["device"] for w in said["workers"]] == ["gpu:0"]


def test_a_recheck_starts_the_workers_of_held_gpus_that_plan_now(isolated: Stack,
                                                                tmp_path: Path) -> None:
    smi, listing = _smi(tmp_path, PART)
    s = replace_settings(isolated, smi)
    recheck = Recheck(s, node_plan(s))
    try:
        recheck.record()
        assert recheck._adopt(node_plan(s)) == []  # nothing changed: nothing starts
        assert [u.cause for u in recheck.held] == ["memory_in_use", "missing"]
        shutil.copy(WHOLE, listing)
        started = recheck._adopt(node_plan(s))
        assert [w.name for w in started] == [f"gpu1@{NODE}", f"gpu2@{NODE}"] and recheck.held == []
        assert recheck._adopt(node_plan(s)) == []  # started once
    finally:
        recheck.close()


def test_the_dashboards_devices_payload_carries_the_new_signals(isolated: Stack, tmp_path: Path) -> None:
    """What the dashboard's device table renders (`GET /api/v1/devices`): each held GPU's cause
    and reason, a GPU's compute mode, and NVML's reading as a typed record (health, reason,
    live memory). The page itself is driven by Chromium in the slow tier (tests/api)."""
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from mxq.api import routes
    from mxq.api.app import app

    smi, _ = _smi(tmp_path, PART)
    s = replace_settings(isolated, smi)
    Recheck(s, node_plan(s)).record()
    reading: JsonObject = {
        "health": "fault", "reason": "NVML reported critical Xid 79 (GPU has fallen off the bus)",
        "memory_used_mib": 2048, "memory_total_mib": 81920, "ecc_uncorrected": 0,
        "row_remap_pending": False, "row_remap_failed": False,
        "clock_event_reasons": ["gpu_idle", "sw_power_cap"], "xids": [79]}
    gpu0 = parse_nvidia_smi(PART.read_text())[0]
    fleet.register(s.database, f"gpu0@{NODE}", NODE, "gpu:0", f"{NODE}.gpu.0", 1, gpu0.info(),
                   nvml=reading)
    token = "s3cret-token-0123"
    app.dependency_overrides[routes.settings] = lambda: s.model_copy(
        update={"api_token": SecretStr(token)})
    try:
        client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        answer = client.get("/api/v1/devices", headers={"Authorization": f"Bearer {token}"})
        page = client.get("/").text
    finally:
        app.dependency_overrides.clear()
    assert answer.status_code == 200, answer.text
    rows = {r["device"]: r for r in answer.json()}
    assert (rows["gpu:1"]["health"], rows["gpu:1"]["unplanned"]) == ("out", "memory_in_use")
    assert rows["gpu:2"]["unplanned"] == "missing" and "is missing" in rows["gpu:2"]["out_reason"]
    live = rows["gpu:0"]
    assert live["compute_mode"] == "Default" and live["unplanned"] is None
    assert live["nvml"]["health"] == "fault" and live["nvml"]["xids"] == [79]
    assert (live["memory_used_mib"], live["memory_total_mib"]) == (2048, 81920)  # NVML's, live
    for needle in ("d.unplanned", "d.compute_mode", "deviceNvml", "<th>compute mode</th>"):
        assert needle in page, needle  # what renders them


def test_a_failing_look_again_leaves_the_launcher_supervising(isolated: Stack, tmp_path: Path) -> None:
    """nvidia-smi failing (or the database down) while the launcher looks again is logged and
    tried later: it must not end the supervisor of the node's other workers."""
    import time

    from mxq.workers.hardware.devices import DeviceError

    smi, _ = _smi(tmp_path, PART)
    s = replace_settings(isolated, smi)

    def broken() -> NodePlan:
        raise DeviceError("nvidia-smi failed on a host with GPUs: exited with 9")

    recheck = Recheck(s, node_plan(s), replan=broken)
    recheck.due = time.monotonic()
    try:
        assert recheck() == []  # asked, in its thread (and maybe taken already)
        wait_until(lambda: recheck() or recheck.pending, 10, "the failed look to be taken",
                   until=lambda pending: pending is None)
        assert recheck.due > time.monotonic()  # tried again later
        assert [u.cause for u in recheck.held] == ["memory_in_use", "missing"]  # still held
    finally:
        recheck.close()
