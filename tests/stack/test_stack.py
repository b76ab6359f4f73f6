"""`mxq up --detach` / `mxq down` on the embedded default: nothing installed, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mxq.workers.launch import groups
from mxq.workers.launch.embedded import EmbeddedRedis
from tests.conftest import Stack, free_port, wait_until


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
        assert again.returncode == 2 and "already up" in again.stderr
        launcher = json.loads((home / "launcher.pid").read_text())["pid"]
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
        launcher = json.loads((home / "launcher.pid").read_text())["pid"]
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
