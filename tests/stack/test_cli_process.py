"""Every `mxq` command once as a real process (`python -m mxq.cli …`), as a user's shell or script
runs it: its start-up, its environment, its output and exit status. Everything else about the CLI
is tested in-process (`Stack.mxq`); `up`, `down`, `worker` and `api` run as processes in
test_stack.py, conftest.py, test_devices.py and test_api.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from mxq.workers.jobs.submit import submit
from tests.conftest import NODE, ROOT, Stack, wait_until

MODEL = "smoke"


@pytest.fixture(scope="module")
def made(workers: Stack) -> dict:
    """A model with two versions, an input and a finished inference job (made in-process)."""
    for _ in range(2):
        added = workers.mxq("models", "add", MODEL, "--arch", "mlp", "--input-shape", "16",
                            "--classes", "4", "--json")
        assert added.returncode == 0, added.stderr
    np.save(workers.home / "data" / "smoke.npy", np.ones((30, 16), np.float32))
    job = workers.wait(submit(workers.settings, "infer", {"model": MODEL, "input": "smoke.npy"}, "cpu:0"))
    assert job["status"] == "succeeded", job["error"]
    return {"job": job["id"]}


def _json(stack: Stack, *args: str) -> Any:  # any JSON value
    proc = stack.mxq_process(*args)
    assert proc.returncode == 0, (args, proc.stderr)
    return json.loads(proc.stdout)


def _migrate(s: Stack, made: dict) -> None:
    proc = s.mxq_process("migrate")
    assert proc.returncode == 0 and "the newest schema" in proc.stdout, proc.stderr


def _models(s: Stack, made: dict) -> None:
    assert MODEL in {m["name"] for m in _json(s, "models", "--json")}
    assert [v["version"] for v in _json(s, "models", "show", MODEL, "--json")] == [1, 2]


def _models_add(s: Stack, made: dict) -> None:
    proc = s.mxq_process("models", "add", "smoke-added", "--arch", "mlp", "--input-shape", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    added = json.loads(proc.stdout)
    assert added["name"] == "smoke-added" and added["version"] == 1
    assert "Warning" not in proc.stderr, proc.stderr  # MXNet's import chatter stays inside


def _models_promote(s: Stack, made: dict) -> None:
    proc = s.mxq_process("models", "promote", MODEL, "1")
    assert proc.returncode == 0, proc.stderr
    assert [v["version"] for v in _json(s, "models", MODEL, "--json") if v["promoted"]] == [1]


def _probe(s: Stack, made: dict) -> None:
    record = _json(s, "probe", "--device", "cpu:1", "--size", "32", "--repeat", "1", "--wait", "--json")
    assert record["status"] == "succeeded" and record["device"] == "cpu:1"


def _infer(s: Stack, made: dict) -> None:
    record = _json(s, "infer", MODEL, "smoke.npy", "--device", "cpu:0", "--wait", "--json")
    assert record["status"] == "succeeded" and record["samples"] == 30


def _train(s: Stack, made: dict) -> None:
    record = _json(s, "train", "mlp", "digits", "--name", "smoke-trained", "--epochs", "1", "--wait",
                   "--json")
    assert record["status"] == "succeeded" and record["model_version"] == 1


def _results(s: Stack, made: dict) -> None:
    rows = _json(s, "results", str(made["job"]), "--format", "json")
    assert [r["index"] for r in rows] == list(range(30))


def _job(s: Stack, made: dict) -> None:
    record = _json(s, "job", str(made["job"]), "--json")
    assert record["id"] == made["job"] and record["status"] == "succeeded"


def _jobs(s: Stack, made: dict) -> None:
    assert made["job"] in {j["id"] for j in _json(s, "jobs", "--limit", "1000", "--json")}


def _devices(s: Stack, made: dict) -> None:
    devices = _json(s, "devices", "--json")
    assert {d["device"] for d in devices if d["alive"]} == {"cpu:0", "cpu:1"}


def _stats(s: Stack, made: dict) -> None:
    assert "cpu:0" in {r["device"] for r in _json(s, "stats", "--by", "device", "--json")}


def _cancel(s: Stack, made: dict) -> None:
    queued = _json(s, "probe", "--device", "cpu:8", "--allow-offline", "--json")
    answer = _json(s, "cancel", str(queued["id"]), "--json")
    assert answer["outcome"] == "cancelled"


def _reconcile(s: Stack, made: dict) -> None:
    report = _json(s, "reconcile", "--json")
    assert set(report) >= {"republished", "requeued", "failed", "leases_freed"}


def _schedule(s: Stack, made: dict) -> None:
    """add, list, show, pause, resume, run-now, rm: each a process of its own."""
    steps: list[tuple[list[str], Callable[[subprocess.CompletedProcess[str]], bool]]] = [
        (["add", "smoke-nightly", "--cron", "0 4 * * *", "--dataset", "nothing/*.npz", "--arch", "mlp",
          "--model", "smoke-nightly"], lambda p: "smoke-nightly" in p.stdout),
        (["list"], lambda p: "smoke-nightly" in p.stdout),
        (["pause", "smoke-nightly"], lambda p: p.returncode == 0),
        (["resume", "smoke-nightly"], lambda p: p.returncode == 0),
        (["run-now", "smoke-nightly"], lambda p: "matches no file" in p.stdout + p.stderr),
        (["show", "smoke-nightly"], lambda p: "matches no file" in p.stdout),
        (["rm", "smoke-nightly"], lambda p: p.returncode == 0),
    ]
    for args, ok in steps:
        proc = s.mxq_process("schedule", *args)
        assert "Traceback" not in proc.stderr and ok(proc), (args, proc.returncode, proc.stdout, proc.stderr)
    assert s.mxq_process("schedule", "show", "smoke-nightly").returncode == 2


def _demo(s: Stack, made: dict) -> None:
    """Probe, train on digits over both devices, infer on each: the trained version is accurate."""
    proc = s.mxq_process("demo", "--copies", "1", "--epochs", "4", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"training digits-demo \(lenet\) on digits over cpu:0, cpu:1", proc.stdout)
    inference = proc.stdout.split("bulk inference per device")[-1]
    accuracy = {cells[0]: float(cells[-1]) for line in inference.splitlines()
                if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) > 1
                and cells[0].startswith("cpu:")}
    assert set(accuracy) == {"cpu:0", "cpu:1"}, proc.stdout
    assert min(accuracy.values()) > 0.8, accuracy  # random weights score about 0.1


def _scheduler(s: Stack, made: dict) -> None:
    """The schedule process alone: its worker answers a remote-control ping, as compose checks."""
    from mxq.workers.broker.app import app_for

    name = f"schedule@{NODE}"
    proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "scheduler"], cwd=ROOT, env=s.environ(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        control = app_for(s.settings).control
        wait_until(lambda: control.ping(destination=[name], timeout=1.0), 120, f"{name} to answer a ping",
                   until=lambda answers: proc.poll() is None and any(name in a for a in answers))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


COMMANDS: dict[str, Callable[[Stack, dict], None]] = {
    "migrate": _migrate, "models": _models, "models add": _models_add, "models promote": _models_promote,
    "probe": _probe, "infer": _infer, "train": _train, "results": _results, "job": _job, "jobs": _jobs,
    "devices": _devices, "stats": _stats, "cancel": _cancel, "reconcile": _reconcile,
    "schedule": _schedule, "demo": _demo, "scheduler": _scheduler,
}


@pytest.mark.parametrize("command", list(COMMANDS), ids=lambda c: c.replace(" ", "-"))
def test_command_as_a_real_process(workers: Stack, made: dict, command: str) -> None:
    COMMANDS[command](workers, made)
