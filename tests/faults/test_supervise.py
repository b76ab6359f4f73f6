"""Supervision faults on a real `mxq up --detach` stack (issue 28, findings 4-7): a stranger's
PID in launcher-NODE.pid, a second stack on the same API port, the embedded Redis SIGKILLed, the
launcher SIGKILLed and then `mxq up` and `mxq down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxq.workers.launch import groups, procs
from mxq.workers.launch.embedded import EmbeddedRedis
from tests.conftest import Stack, free_port, wait_until
from tests.conftest import _stack as make_stack
from tests.faults.stacks import report

pytestmark = [pytest.mark.slow, pytest.mark.both_legs]
NODE = "supnode"


def _stack(home: Path, port: int) -> Stack:
    return Stack("sup", home, {"MXQ_HOME": str(home), "MXQ_NODE": NODE, "MXQ_CPU_DEVICES": "1",
                               "MXQ_NVIDIA_SMI": str(home / "absent"), "MXQ_API_PORT": str(port),
                               "MXQ_HEARTBEAT_SECONDS": "0.5"})


@pytest.fixture(params=["embedded", "system"])
def sup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """A home for `mxq up`: the embedded broker and SQLite, or the system Redis and a fresh
    PostgreSQL database."""
    gen = make_stack(request.param, tmp_path, 12)
    base = next(gen)
    stack = _stack(base.home, free_port())
    stack.name = base.name
    stack.env.update({k: v for k, v in base.env.items() if k in ("MXQ_BROKER_URL", "MXQ_DATABASE_URL")})
    try:
        yield stack
    finally:
        next(gen, None)


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _members(leaders: list[procs.Proc | None]) -> list[int]:
    return [pid for p in leaders if p is not None for pid in groups.members(p.pid)]


def test_supervision_survives_strangers_clashes_and_deaths(sup: Stack, tmp_path: Path) -> None:
    stack, home, port = sup, sup.home, int(sup.env["MXQ_API_PORT"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
    try:
        _scenario(stack, home, port, tmp_path, stranger)
    finally:
        stranger.kill()
        stranger.wait()


def _scenario(stack: Stack, home: Path, port: int, tmp_path: Path,
              stranger: subprocess.Popen) -> None:
    api = f"http://127.0.0.1:{port}"
    (home / f"launcher-{NODE}.pid").write_text(str(stranger.pid))  # finding 5: a PID that is not ours
    seen: list[procs.Proc | None] = []
    try:
        up = stack.mxq_process("up", "--detach", timeout=240)
        assert up.returncode == 0, up.stderr  # not "already up"
        assert "stale" in up.stderr and stranger.poll() is None
        seen += wait_until(lambda: groups.records(home, NODE), 30, "the API's record",
                           until=lambda found: any(p and "mxq.cli api" in p.command for p in found))

        # Finding 6: a second stack on the same port fails before it starts anything.
        holder = next(p for p in seen if p is not None and "mxq.cli api" in p.command)
        clash = _stack(tmp_path / "other", port).mxq_process("up", "--detach", timeout=120)
        assert clash.returncode == 2, clash.stdout
        assert f"127.0.0.1:{port} is in use by pid {holder.pid}" in clash.stderr
        assert "MXQ_API_PORT" in clash.stderr and len(clash.stderr.strip().splitlines()) == 1
        assert not EmbeddedRedis(tmp_path / "other").running()

        launcher = procs.read(home / f"launcher-{NODE}.pid")
        assert launcher is not None and procs.matches(launcher)
        if stack.name == "embedded":
            _embedded_redis_dies(home, api, launcher)

        # Finding 4: the launcher dies; its children run on until `mxq up` ends them.
        current = groups.records(home, NODE)  # a worker the launcher restarted has a new group
        seen += current
        os.kill(launcher.pid, signal.SIGKILL)
        wait_until(lambda: procs.matches(launcher), 30, "the launcher to die",
                   until=lambda alive: not alive)
        orphans = [pid for pid in _members(current) if procs.identify(pid)]
        assert len(orphans) >= 3, current  # its worker, schedule process and API run on
        again = stack.mxq_process("up", "--detach", timeout=240)
        assert again.returncode == 0, again.stderr
        assert "processes a dead launcher had left running" in again.stderr
        assert not any(procs.identify(pid) for pid in orphans)
        seen += groups.records(home, NODE)
        devices = stack.mxq_json("devices")
        assert [(d["device"], d["alive"]) for d in devices] == [("cpu:0", True)]
        assert wait_until(lambda: _status(f"{api}/api/v1/devices")[0], 60, "the new API",
                          until=lambda code: code == 200) == 200
    finally:
        down = stack.mxq_process("down", timeout=120)
    assert down.returncode == 0, down.stderr
    left = _members(seen)
    assert not left, left
    assert not EmbeddedRedis(home).running()
    assert stranger.poll() is None  # never signalled
    report("launcher SIGKILL, then up and down", {"backend": stack.name,
                                                  "orphans_ended": len(orphans),
                                                  "left_running": len(left),
                                                  "stranger_signalled": 0})


def _embedded_redis_dies(home: Path, api: str, launcher: procs.Proc) -> None:
    """Finding 7: SIGKILL the embedded Redis. With the launcher paused, health and /metrics say
    the broker is down; once it runs again, the launcher restarts Redis and health is 200."""
    redis = EmbeddedRedis(home)
    first = redis.recorded()
    assert first is not None
    os.kill(launcher.pid, signal.SIGSTOP)
    try:
        os.kill(first.pid, signal.SIGKILL)
        status, body = wait_until(lambda: _status(f"{api}/api/v1/devices"), 60, "health 503",
                                  until=lambda answer: answer[0] == 503)
        assert json.loads(body)["detail"].startswith("broker unreachable")
        assert "mxq_broker_up 0.0" in _status(f"{api}/metrics")[1]
    finally:
        os.kill(launcher.pid, signal.SIGCONT)
    wait_until(lambda: redis.recorded(), 60, "the launcher to restart Redis",
               until=lambda now: now is not None and now != first and procs.matches(now))
    wait_until(lambda: _status(f"{api}/api/v1/devices")[0], 60, "health 200",
               until=lambda code: code == 200)
    assert "restarted the embedded Redis" in (home / "logs" / "launcher.log").read_text()
