"""A device's health (issue 45): `healthy` while its worker beats, `out` once its worker refused
it (a failed start check, a fault during a job) with why and since when, `offline` otherwise;
shown by `mxq devices`, `/metrics`, and the queue's reason of a job that waits for it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from mxq.api.metrics import render_metrics
from mxq.api.schemas import DeviceRecord
from mxq.cli import render
from mxq.db import fleet, jobs
from mxq.db.records import WorkerRecord
from mxq.db.webhooks import endpoints, outbox
from mxq.workers.fleet.device_table import device_table
from mxq.workers.jobs.queue_view import queue_view
from tests.conftest import NODE, Stack, run_cli

REASON = "gpu:1 failed its start check: matmul off by 3.2e+01"
TTL = 5.0


def _worker(url: str, index: int, alive: bool, info: dict[str, object] | None = None) -> str:
    name = f"cpu{index}@{NODE}"
    fleet.register(url, name, NODE, f"cpu:{index}", f"{NODE}.cpu.{index}", None,
                   info or {"device": f"cpu:{index}"}, alive=alive)
    return name


def _fleet(url: str) -> dict[str, str]:
    """cpu:0 alive, cpu:1 out (refused), cpu:2 offline (stopped): their worker names."""
    names = {"alive": _worker(url, 0, True), "out": _worker(url, 1, True),
             "offline": _worker(url, 2, False)}
    fleet.refuse(url, names["out"], REASON)
    return names


def _by_name(url: str) -> dict[str, WorkerRecord]:
    return {w["name"]: w for w in fleet.list_workers(url, TTL)}


@pytest.mark.both_legs
def test_workers_are_healthy_out_with_why_and_since_when_or_offline(isolated: Stack) -> None:
    url = isolated.settings.database
    before = datetime.now(UTC)
    names = _fleet(url)
    rows = _by_name(url)
    alive, out, offline = rows[names["alive"]], rows[names["out"]], rows[names["offline"]]
    assert (alive["health"], alive["out_reason"], alive["out_since"]) == ("healthy", None, None)
    assert (offline["health"], offline["out_reason"], offline["out_since"]) == ("offline", None, None)
    assert out["health"] == "out" and not out["alive"] and out["out_reason"] == REASON
    assert out["out_since"] is not None
    since = datetime.fromisoformat(out["out_since"])
    assert since.tzinfo is not None and before - timedelta(seconds=1) <= since <= datetime.now(UTC)
    fleet.refuse(url, names["out"], "still failing")  # the launcher's next probe: refused again
    again = _by_name(url)[names["out"]]
    assert (again["health"], again["out_reason"], again["out_since"]) == (
        "out", "still failing", out["out_since"])  # out since the first refusal


@pytest.mark.both_legs
def test_a_device_that_passes_its_check_again_is_healthy_and_its_old_reason_is_gone(
        isolated: Stack) -> None:
    url = isolated.settings.database
    hook = endpoints.add_hook(url, "https://hooks.example.com/in", ["device.out", "device.back"],
                              "admin")
    name = _fleet(url)["out"]
    since = _by_name(url)[name]["out_since"]
    # Its worker starts again and passes: the heartbeat's registration (workers/fleet/heartbeat).
    fleet.register(url, name, NODE, "cpu:1", f"{NODE}.cpu.1", 1234, {}, alive=True)
    row = _by_name(url)[name]
    assert (row["health"], row["out_reason"], row["out_since"]) == ("healthy", None, None)
    told = {d["event"]: d["payload"]["device"] for d in outbox.list_deliveries(url, hook["id"])}
    assert set(told) == {"device.out", "device.back"}  # issue 60: back is told as out is
    assert (told["device.back"]["device"], told["device.back"]["out_reason"],
            told["device.back"]["out_since"]) == ("cpu:1", REASON, since)
    fleet.register(url, name, NODE, "cpu:1", f"{NODE}.cpu.1", 1234, {}, alive=True)  # a restart
    assert len(outbox.list_deliveries(url, hook["id"])) == 2  # back once, not at each start
    assert row["info"] == {"device": "cpu:1"}  # the launcher's device info stays, the refusal not
    fleet.mark_dead(url, name)  # stopped later: offline, not out for the reason it had healed from
    assert _by_name(url)[name]["health"] == "offline"


def test_alive_wins_over_a_refusal_and_out_is_said_with_its_time() -> None:
    assert fleet.health(True, {"refused": REASON}) == ("healthy", None, None)
    assert fleet.health(False, {"refused": REASON}) == ("out", REASON, None)  # before refused_at
    assert fleet.health(False, {}) == ("offline", None, None)
    now = datetime(2025, 3, 4, 12, 30, tzinfo=UTC)
    assert fleet.out_note("x", "2025-03-04T12:03:09+00:00", now) == "out since 12:03 UTC: x"
    assert fleet.out_note("x", "2025-03-01T09:05:00+00:00", now) == "out since 2025-03-01 09:05 UTC: x"
    assert fleet.out_note("x", None, now) == "out: x"


def test_mxq_devices_shows_each_devices_health_and_why_one_is_out(
        isolated: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    url = isolated.settings.database
    _fleet(url)
    monkeypatch.setattr(render, "out", Console(width=400))  # one line a row, however long
    shown = run_cli(["devices"], isolated.env)
    assert shown.returncode == 0, shown.stderr
    lines = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines()
             if line.count("│") > 2 and "cpu:" in line}
    since = datetime.fromisoformat(_by_name(url)[f"cpu1@{NODE}"]["out_since"] or "")
    assert f"out since {since:%H:%M} UTC: {REASON}" in lines["cpu:1"], shown.stdout
    assert "healthy" in lines["cpu:0"] and "offline" in lines["cpu:2"], shown.stdout
    assert "health" in shown.stdout.splitlines()[2]  # the header
    listed = run_cli(["devices", "--json"], isolated.env)
    rows = {r["device"]: r for r in json.loads(listed.stdout)}
    assert (rows["cpu:1"]["health"], rows["cpu:1"]["out_reason"]) == ("out", REASON)
    assert rows["cpu:1"]["refused"] == REASON  # the field scripts read before stays
    assert rows["cpu:0"]["health"] == "healthy" and rows["cpu:2"]["health"] == "offline"
    for row in device_table(isolated.settings):
        DeviceRecord.model_validate(row)  # what GET /api/v1/devices answers with


def test_metrics_say_which_device_is_healthy_and_since_when_one_is_out(isolated: Stack) -> None:
    url = isolated.settings.database
    _fleet(url)
    text = render_metrics(isolated.settings)[0].decode()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("mxq_device_")}
    for index, healthy in ((0, 1.0), (1, 0.0), (2, 0.0)):
        assert values[f'mxq_device_healthy{{device="cpu:{index}",node="{NODE}"}}'] == healthy
    since = datetime.fromisoformat(_by_name(url)[f"cpu1@{NODE}"]["out_since"] or "")
    out = [k for k in values if k.startswith("mxq_device_out_since_seconds")]
    assert out == [f'mxq_device_out_since_seconds{{device="cpu:1",node="{NODE}"}}']
    assert values[out[0]] == pytest.approx(since.timestamp())


def test_a_gpus_memory_in_use_is_on_the_device_table_and_metrics(
        isolated: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures nvidia-smi gave when the worker was planned (issue 45, item 7)."""
    url = isolated.settings.database
    _worker(url, 3, True, {"name": "NVIDIA L4", "memory_used_mib": 1200, "memory_total_mib": 23034})
    _worker(url, 0, True)
    monkeypatch.setattr(render, "out", Console(width=400))
    shown = run_cli(["devices"], isolated.env)
    lines = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines()
             if line.count("│") > 2 and "cpu:" in line}
    assert "1200/23034 MiB" in lines["cpu:3"] and "MiB" not in lines["cpu:0"], shown.stdout
    text = render_metrics(isolated.settings)[0].decode()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("mxq_device_memory")}
    assert values == {f'mxq_device_memory_used_bytes{{device="cpu:3",node="{NODE}"}}': 1200 * 2.0**20,
                      f'mxq_device_memory_total_bytes{{device="cpu:3",node="{NODE}"}}': 23034 * 2.0**20}


def test_a_job_queued_to_a_device_that_is_out_waits_for_it_saying_why(isolated: Stack) -> None:
    s = isolated.settings
    url = s.database
    _fleet(url)
    on_out = jobs.create_job(url, "probe", {}, "cpu:1", f"{NODE}.cpu.1")
    on_offline = jobs.create_job(url, "probe", {}, "cpu:2", f"{NODE}.cpu.2")
    why = {e["id"]: e["why"] for e in queue_view(s)}
    since = datetime.fromisoformat(_by_name(url)[f"cpu1@{NODE}"]["out_since"] or "")
    assert why[on_out] == (f"waits for cpu:1, out since {since:%H:%M} UTC: {REASON}; it runs "
                           "when the device passes its check again")
    assert why[on_offline] == f"no capable device: no live worker takes its queue {NODE}.cpu.2"
    shown = run_cli(["job", str(on_out), "--json"], isolated.env)  # `mxq job` says it too
    assert shown.returncode == 0, shown.stderr
    assert f"waits for cpu:1, out since {since:%H:%M} UTC: {REASON}" in shown.stdout


def test_a_job_named_for_a_device_that_is_out_is_refused_unless_it_may_wait(isolated: Stack) -> None:
    """The refusal said "has no live worker; start workers with `mxq up`": wrong for a device
    whose worker is up and refused it. It says why the device is out; --allow-offline queues."""
    url = isolated.settings.database
    _fleet(url)
    refused = run_cli(["probe", "--device", "cpu:1"], isolated.env)
    assert refused.returncode == 2
    assert f"device cpu:1 on node {NODE} is out since " in refused.stderr
    assert f"UTC: {REASON}; pass --allow-offline" in refused.stderr
    queued = run_cli(["probe", "--device", "cpu:1", "--allow-offline", "--json"], isolated.env)
    assert queued.returncode == 0, queued.stderr
    assert json.loads(queued.stdout)["queue"] == f"{NODE}.cpu.1"
