"""`mxq up --detach` / `mxq down` on the embedded default: nothing installed, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mxq.workers.launch import groups
from mxq.workers.launch.embedded import EmbeddedRedis
from tests.conftest import ROOT, Stack, free_port, wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


def _get_json(url: str, timeout: float = 60) -> Any:  # any JSON value

    def answer() -> object:  # the decoded body, or the error of this try
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.load(r)
        except OSError as exc:
            return exc

    return wait_until(answer, timeout, f"{url} to answer",
                      until=lambda value: not isinstance(value, OSError), interval=0.3)


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_up_probe_every_device_down(tmp_path: Path) -> None:
    home = tmp_path / "var"
    port = free_port()
    stack = Stack("up", home, {"MXQ_HOME": str(home), "MXQ_NODE": "upnode", "MXQ_CPU_DEVICES": "2",
                               "MXQ_NVIDIA_SMI": str(tmp_path / "absent"), "MXQ_API_PORT": str(port)})
    up = stack.mxq_process("up", "--detach", timeout=240)
    try:
        assert up.returncode == 0, up.stderr
        assert "cpu:0" in up.stdout and "cpu:1" in up.stdout
        assert EmbeddedRedis(home).running() and (home / "mxq.db").exists()
        devices = stack.mxq_json("devices")
        assert [(d["device"], d["alive"]) for d in devices] == [("cpu:0", True), ("cpu:1", True)]
        pids = [d["pid"] for d in devices]
        for d in devices:
            job = stack.mxq_json("probe", "--device", d["device"], "--size", "64", "--wait")
            assert job["status"] == "succeeded" and job["device"] == d["device"]
        api = _get_json(f"http://127.0.0.1:{port}/api/v1/devices")  # `mxq up` serves the API too
        assert [d["device"] for d in api] == ["cpu:0", "cpu:1"]
        again = stack.mxq_process("up", "--detach")
        assert again.returncode == 2 and "already up for node upnode" in again.stderr
        launcher = json.loads((home / "launcher-upnode.pid").read_text())["pid"]
    finally:
        down = stack.mxq_process("down", timeout=120)
    assert down.returncode == 0 and "embedded Redis" in down.stdout
    assert not EmbeddedRedis(home).running()
    assert not any(_alive(p) for p in [*pids, launcher])
    after = stack.mxq_json("devices")
    assert [d["alive"] for d in after] == [False, False]


@pytest.mark.slow
def test_down_ends_every_process_even_after_the_launcher_died(tmp_path: Path) -> None:
    """`mxq down` once left the schedule worker's beat child running under PID 1: each child of
    the launcher leads its own process group, and down ends what is left of every group."""
    home = tmp_path / "var"
    stack = Stack("up", home, {"MXQ_HOME": str(home), "MXQ_NODE": "downnode", "MXQ_CPU_DEVICES": "1",
                               "MXQ_NVIDIA_SMI": str(tmp_path / "absent"), "MXQ_API_PORT": str(free_port())})
    up = stack.mxq_process("up", "--detach", timeout=240)
    try:
        assert up.returncode == 0, up.stderr
        recorded = groups.recorded(home, "downnode")
        assert len(recorded) == 3  # cpu:0's worker, the schedule worker (with beat), the API
        launcher = json.loads((home / "launcher-downnode.pid").read_text())["pid"]
        os.kill(launcher, signal.SIGKILL)  # it can no longer stop anything
        wait_until(lambda: _alive(launcher), 30, "the launcher to die", until=lambda alive: not alive)
        before = {g: groups.members(g) for g in recorded}
        assert all(before.values()), before  # its children outlive it
    finally:
        down = stack.mxq_process("down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert "processes the workers had left behind" in down.stdout
    left = {g: groups.members(g) for g in recorded}
    assert not any(left.values()), (left, down.stdout)  # down says what it ignored as stale
    assert not groups.groups_file(home, "downnode").exists()


@pytest.mark.slow
def test_a_second_launcher_in_one_home_keeps_its_own_record(tmp_path: Path) -> None:
    """`mxq up` for one node, then `mxq worker` for another in the same home: the second once
    wrote over the first's record, `mxq down` stopped only it, and the first launcher lived on,
    restarting its workers, schedule process and API. Each node's launcher has its own record;
    a second launcher of the same node is refused; down ends both; up starts one set again."""
    home = tmp_path / "var"
    stack = Stack("up", home, {"MXQ_HOME": str(home), "MXQ_NODE": "first", "MXQ_CPU_DEVICES": "1",
                               "MXQ_NVIDIA_SMI": str(tmp_path / "absent"), "MXQ_API_PORT": str(free_port())})
    up = stack.mxq_process("up", "--detach", timeout=240)
    second = None
    try:
        assert up.returncode == 0, up.stderr
        twin = stack.mxq_process("worker", timeout=120)  # the same node: refused at once
        assert twin.returncode == 2 and "already up for node first" in twin.stderr, twin.stderr
        assert len(twin.stderr.strip().splitlines()) == 1
        second = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker"], cwd=ROOT,
                                  env=stack.environ(MXQ_NODE="second"), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_until(lambda: stack.mxq_json("devices"), 180, "the second node's worker to beat",
                   until=lambda ds: any(d["node"] == "second" and d["alive"] for d in ds), interval=1)
        launchers = [json.loads((home / f"launcher-{node}.pid").read_text())["pid"]
                     for node in ("first", "second")]
        assert second.pid in launchers
    finally:
        down = stack.mxq_process("down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert down.stdout.count("workers (launcher pid") == 2, down.stdout
    assert second is not None and second.wait(timeout=30) == 0
    assert not any(_alive(pid) for pid in launchers)
    assert not any(d["alive"] for d in stack.mxq_json("devices"))
    again = stack.mxq_process("up", "--detach", timeout=240)
    try:
        assert again.returncode == 0, again.stderr
        alive = [(d["node"], d["device"]) for d in stack.mxq_json("devices") if d["alive"]]
        assert alive == [("first", "cpu:0")]  # one set, not a duplicate beside a survivor
    finally:
        assert stack.mxq_process("down", timeout=120).returncode == 0
