"""Two nodes on one machine: two `mxq worker` launchers (nodeA, nodeB, one CPU device each, one
core each) against one broker and database, each with its own MXQ_HOME as separate hosts would
have. Multi-node dist_sync training, failure of a part, and work moving off a killed node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from mxq.db.fleet import alive_since, list_workers
from mxq.db.schema import utcnow
from mxq.json_types import JsonObject
from mxq.workers.jobs.submit import submit
from mxq.workers.launch import groups
from tests.conftest import ROOT, Stack, _stack, free_port, wait_until
from tests.support.workers import wait_alive

if TYPE_CHECKING:
    from mxq.db.records import JobRecord, WorkerRecord
    from mxq.tasks.job_context import JobContext
    from mxq.workers.jobs.jobspecs import TrainParams
    from mxq.workers.settings import Settings

NODES = ("nodeA", "nodeB")
SCHEDULE_NODE = "nodeB"  # runs the schedule process (the reconciler) and survives every test
EPOCHS = "8"
# About two seconds of matrix multiplies on one core: long enough to be caught running.
PROBE = {"size": 384, "batch": 4, "repeat": 500}

pytestmark = pytest.mark.timeout(900)


@dataclass
class Cluster:
    stack: Stack
    launchers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def job(self, job_id: int) -> JobRecord:
        return self.stack.job(job_id)


def _node_env(stack: Stack, node: str) -> dict[str, str]:
    s = stack.settings
    return {"MXQ_NODE": node, "MXQ_CPU_DEVICES": "1", "MXQ_HOME": str(stack.home / node),
            "MXQ_BROKER_URL": s.broker, "MXQ_DATABASE_URL": s.database,
            "MXQ_NODE_ADDRESS": "127.0.0.1", "MXQ_RECONCILE_SECONDS": "2",
            "MXQ_API_PORT": str(free_port()), "MXQ_DIST_START_SECONDS": "120"}


def start_node(stack: Stack, node: str, core: int) -> subprocess.Popen:
    """`mxq worker` for `node` in a process group of its own (killing the group is the node
    dying), on one core; returns once its worker beats."""
    args = ["--with-schedule"] if node == SCHEDULE_NODE else []
    since = utcnow()
    cores = sorted(os.sched_getaffinity(0))
    pin = {cores[core % len(cores)]}
    (stack.home / node).mkdir(parents=True, exist_ok=True)
    log_path = stack.home / f"launcher-{node}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker", *args], cwd=ROOT,
                                env=stack.environ(**_node_env(stack, node)), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, pin))

    def alive() -> set[str]:
        assert proc.poll() is None, f"launcher of {node} exited: {log_path.read_text()}"
        return alive_since(stack.settings.database, [f"cpu0@{node}"], since, 5.0)

    wait_until(alive, 180, f"cpu0@{node} to beat", until=lambda names: names == {f"cpu0@{node}"},
               interval=0.2)
    return proc


def kill_node(stack: Stack, node: str, proc: subprocess.Popen) -> None:
    """The node dies at once: its launcher, and each child's process group (the workers and
    their children: every child of a launcher leads its own group, mxq.workers.launch.groups)."""
    for group in [proc.pid, *groups.recorded(stack.home / node, node)]:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


@pytest.fixture(scope="module", params=["embedded", "system"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    gen = _stack(request.param, tmp_path_factory.mktemp(f"nodes-{request.param}"), 9)
    stack = next(gen)
    c = Cluster(stack)
    try:
        for core, node in enumerate(NODES):
            c.launchers[node] = start_node(stack, node, core)
        yield c
    finally:
        for proc in c.launchers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for node in NODES:  # whatever a killed node's launcher could not stop
            groups.end_recorded(stack.home / node, node)
        next(gen, None)


def _train(stack: Stack, *args: str) -> dict:
    proc = stack.mxq("train", *args, "--wait", "--json")
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def _role_pids(port: str) -> list[int]:
    """Processes of this user whose environment names the job's ps-lite port."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"DMLC_PS_ROOT_PORT={port}".encode() in env:
            found.append(int(entry.name))
    return found


def _parts(stack: Stack, parent: int) -> list[dict]:
    return sorted((j for j in stack.mxq_json("jobs", "--kind", "train", "--limit", "1000")
                   if j["parent_id"] == parent), key=lambda j: j["chunk_index"])


@pytest.mark.slow
def test_two_nodes_train_as_well_as_one(cluster: Cluster) -> None:
    stack = cluster.stack
    one = _train(stack, "mlp", "digits", "--name", "solo", "--epochs", EPOCHS, "--seed", "1")
    two = _train(stack, "mlp", "digits", "--name", "duo", "--epochs", EPOCHS, "--seed", "1",
                 "--nodes", "2")
    assert one["status"] == "succeeded", one
    assert two["status"] == "succeeded", two
    solo, duo = one["epochs"][-1]["val_accuracy"], two["epochs"][-1]["val_accuracy"]
    print(f"val accuracy after {EPOCHS} epochs: 1 node {solo:.4f}, 2 nodes {duo:.4f}")
    assert duo >= 0.9 and abs(duo - solo) <= 0.03, (solo, duo)
    # per-node throughput, summed for the job
    per_node = two["result"]["per_node"]
    assert set(per_node) == set(NODES), per_node
    assert all(n["samples_per_sec"] > 0 for n in per_node.values())
    assert {n["rank"] for n in per_node.values()} == {0, 1}
    assert two["samples_per_sec"] == pytest.approx(sum(n["samples_per_sec"] for n in per_node.values()))
    assert sorted(two["devices"]) == ["cpu:0@nodeA", "cpu:0@nodeB"]
    assert [e["epoch"] for e in two["epochs"]] == list(range(1, int(EPOCHS) + 1))
    assert set(two["epochs"][-1]["per_device"]) == {"cpu:0@nodeA", "cpu:0@nodeB"}
    # one part per node, through the node's device queue, with the DMLC settings
    parts = _parts(stack, two["id"])
    assert [(p["queue"], p["status"]) for p in parts] == [
        (f"{p['node']}.cpu.0", "succeeded") for p in parts]
    assert {p["node"] for p in parts} == set(NODES)
    assert parts[0]["node"] == two["node"]  # part 0 (the scheduler's host) on the leader's node
    # dist_sync kept the weights equal on both nodes: the same validation accuracy
    assert parts[0]["result"]["val_accuracy"] == parts[1]["result"]["val_accuracy"]
    env = parts[0]["params"]["dist"]["env"]
    assert env["DMLC_NUM_WORKER"] == "2" and env["DMLC_NUM_SERVER"] == "1"
    assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1"
    assert _role_pids(env["DMLC_PS_ROOT_PORT"]) == []  # scheduler and server are gone
    # registered once, as the job's
    models = stack.mxq_json("models", "duo")
    assert len(models) == 1 and models[0]["source"] == f"train:job-{two['id']}"
    assert two["model_version"] == 1 and two["result"]["val_accuracy"] == models[0]["metrics"]["val_accuracy"]


@pytest.mark.slow
def test_a_part_whose_worker_dies_fails_the_job_without_orphans(cluster: Cluster) -> None:
    stack = cluster.stack
    job_id = submit(stack.settings, "train", {"arch": "mlp", "dataset": "digits", "name": "cut",
                                              "nodes": 2, "epochs": 400}, "auto")

    def running_record() -> dict:
        record = stack.mxq_json("job", str(job_id))
        assert stack.job(job_id)["status"] == "running", stack.job(job_id)
        return record

    wait_until(running_record, 300, f"job {job_id} to record 2 epochs while running",
               until=lambda record: len(record.get("epochs") or []) >= 2, interval=0.2)
    parts = _parts(stack, job_id)
    port = parts[0]["params"]["dist"]["env"]["DMLC_PS_ROOT_PORT"]
    assert len(_role_pids(port)) >= 4  # scheduler, server, two trainers
    victim = parts[1]
    pid = {w["name"]: w["pid"] for w in list_workers(stack.settings.database, 5.0)}[victim["worker"]]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    done = stack.wait(job_id, timeout=300)
    assert done["status"] == "failed"
    print(f"error: {done['error']}")
    error = done["error"] or ""
    assert f"part 1 on node {victim['node']}" in error, error
    assert "Traceback" not in error
    assert {p["status"] for p in _parts(stack, job_id)} == {"failed"}
    # nothing of the job is left running, on either node
    wait_until(lambda: _role_pids(port), 30, f"the job's processes (port {port}) to exit",
               until=lambda pids: not pids, interval=0.2)
    assert "cut" not in {m["name"] for m in stack.mxq_json("models")}
    # the worker is back (its launcher restarted it) and its node runs work again
    wait_alive(stack, victim["worker"], pid)
    there = stack.settings.model_copy(update={"node": victim["node"]})
    again = stack.wait(submit(there, "probe", {"size": 64, "batch": 2, "repeat": 1}, "cpu:0"),
                       timeout=120)
    assert again["status"] == "succeeded" and again["node"] == victim["node"]


@pytest.mark.slow
def test_auto_jobs_use_both_nodes_and_move_off_a_killed_node(cluster: Cluster) -> None:
    stack = cluster.stack
    for node in NODES:
        wait_alive(stack, f"cpu0@{node}", -1)
    devices = {(d["node"], d["device"]): d for d in stack.mxq_json("devices")}
    assert {k for k, d in devices.items() if d["alive"]} == {(n, "cpu:0") for n in NODES}
    ids = [submit(stack.settings, "probe", dict(PROBE), "auto") for _ in range(8)]
    victim = next(n for n in NODES if n != SCHEDULE_NODE)

    def spread(records: list[JobRecord]) -> bool:
        nodes = {r["node"] for r in records if r["node"]}
        running = [r for r in records if r["status"] == "running" and r["node"] == victim
                   and (r["progress"] or 0) < 0.5]  # (far from its end: it is still running at the kill)
        return nodes == set(NODES) and bool(running)

    wait_until(lambda: [stack.job(i) for i in ids], 300,
               f"both nodes to take work and {victim} to be early in a running job",
               until=spread, interval=0.05)
    kill_node(stack, victim, cluster.launchers[victim])
    caught = [i for i in ids if (r := stack.job(i))["status"] == "running" and r["node"] == victim]
    assert caught, "the job running on the victim finished before the kill"
    records = [stack.wait(i, timeout=300) for i in ids]
    assert {r["status"] for r in records} == {"succeeded"}, [(r["id"], r["error"]) for r in records]
    for job_id in caught:  # what ran on the dead node was requeued and ran on the other
        moved = stack.mxq_json("job", str(job_id))
        assert moved["node"] == SCHEDULE_NODE and moved["attempts"] == 2, moved
        assert any(e["kind"] == "requeued" for e in moved["events"]), moved["events"]
    wait_until(lambda: {(d["node"], d["device"]): d["alive"] for d in stack.mxq_json("devices")},
               60, f"{victim}'s cpu:0 to be dead and {SCHEDULE_NODE}'s alive",
               until=lambda alive: alive == {(victim, "cpu:0"): False, (SCHEDULE_NODE, "cpu:0"): True},
               interval=0.2)


# The watching and settling rules on the database alone (no workers, no MXNet processes).

TRAIN: JsonObject = {"arch": "mlp", "dataset": "digits", "name": "m", "nodes": 2}


def _split_job(url: str) -> tuple[int, list[int]]:
    from mxq.db import jobs
    from mxq.db.chunks import fan_out
    from mxq.db.jobs import Placement
    from mxq.workers.jobs.jobspecs import stored, validate

    params = stored(validate("train", TRAIN))
    parent = jobs.create_job(url, "train", params, "auto", "pool.cpu")
    assert jobs.claim(url, parent, Placement("cpu0@a", "a", "cpu:0"), 3, 60) is jobs.Claim.RUN
    env = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "1", "DMLC_NUM_SERVER": "1",
           "DMLC_NUM_WORKER": "2"}
    parts: list[dict[str, object]] = [
        {**params, "dist": {"parent": parent, "index": i, "node": node, "host": i == 0, "env": env}}
        for i, node in enumerate("ab")]
    made = fan_out(url, parent, "train", parts, ["a.cpu.0", "b.cpu.0"], ["cpu:0", "cpu:0"])
    assert [q for _, _, q in made] == ["a.cpu.0", "b.cpu.0"]
    return parent, [i for i, _, _ in made]


def _context(s: Settings, job_id: int, node: str) -> JobContext:
    from mxq.tasks.job_context import JobContext

    record = _job(s.database, job_id)
    assert record["queue"] is not None
    return JobContext(job_id, "train", record["params"], "cpu:0", s, record["queue"], "cpu:0",
                      record["parent_id"], ["cpu:0"], f"cpu0@{node}")


def _job(url: str, job_id: int) -> JobRecord:
    from mxq.db.reports.history import require_job

    return require_job(url, job_id, with_metrics=True)


@pytest.fixture
def db(tmp_path: Path) -> Settings:
    from mxq.db.migrate import upgrade
    from mxq.workers.settings import Settings

    s = Settings(home=tmp_path, heartbeat_seconds=0.5, dist_start_seconds=1.0)
    upgrade(s.database)
    return s


def _run_parts(s: Settings, ids: list[int]) -> list[tuple[JobContext, TrainParams]]:
    from mxq.db import jobs
    from mxq.db.jobs import Placement
    from mxq.workers.jobs.jobspecs import TrainParams

    contexts = []
    for job_id, node in zip(ids, "ab", strict=True):
        assert jobs.claim(s.database, job_id, Placement(f"cpu0@{node}", node, "cpu:0"), 3, 60) \
            is jobs.Claim.RUN
        ctx = _context(s, job_id, node)
        contexts.append((ctx, ctx.params(TrainParams)))
    return contexts


def test_a_part_that_died_stops_the_others_and_the_job_names_it(db: Settings) -> None:
    from mxq.db import jobs
    from mxq.db.chunks import settle_parent
    from mxq.tasks.job_context import JobFailed
    from mxq.tasks.training.dist import _check_peers

    parent, ids = _split_job(db.database)
    (ctx0, p0), _ = _run_parts(db, ids)
    assert _check_peers(db, ctx0, p0, joined=True, waited=0) is None
    jobs.orphan(db.database, "cpu0@b")  # its worker died: requeued, no heartbeat
    verdict = _check_peers(db, ctx0, p0, joined=True, waited=0)
    assert isinstance(verdict, JobFailed)
    assert str(verdict) == (f"stopped because part 1 on node b (job {ids[1]}) failed: its worker "
                            "on node b died while running it")
    assert _job(db.database, ids[1])["status"] == "failed"
    jobs.fail(db.database, ids[0], str(verdict), worker="cpu0@a")
    assert settle_parent(db.database, parent)
    done = _job(db.database, parent)
    assert done["status"] == "failed"
    assert done["error"] == (f"part 1 on node b (job {ids[1]}) failed: its worker on node b died "
                             "while running it")


def test_nodes_that_do_not_all_join_in_time_fail_the_job(db: Settings) -> None:
    from mxq.db import jobs
    from mxq.db.jobs import Placement
    from mxq.tasks.job_context import JobFailed
    from mxq.tasks.training.dist import _check_peers
    from mxq.workers.jobs.jobspecs import TrainParams

    parent, ids = _split_job(db.database)
    assert jobs.claim(db.database, ids[0], Placement("cpu0@a", "a", "cpu:0"), 3, 60) is jobs.Claim.RUN
    ctx = _context(db, ids[0], "a")
    p = ctx.params(TrainParams)
    assert _check_peers(db, ctx, p, joined=False, waited=0.5) is None  # part 1 may still come
    assert _check_peers(db, ctx, p, joined=True, waited=5) is None  # joined: no start-up limit
    verdict = _check_peers(db, ctx, p, joined=False, waited=5)
    assert isinstance(verdict, JobFailed)
    assert "did not all join within 1s (MXQ_DIST_START_SECONDS)" in str(verdict)
    assert "part 1 on node b queued" in str(verdict)
    late = _job(db.database, ids[1])
    assert late["status"] == "failed" and "not started within 1s" in (late["error"] or "")


def test_cancelling_the_job_stops_every_part(db: Settings) -> None:
    from mxq.db import jobs
    from mxq.tasks.job_context import JobCancelled
    from mxq.tasks.training.dist import _check_peers

    parent, ids = _split_job(db.database)
    contexts = _run_parts(db, ids)
    assert jobs.cancel(db.database, parent) is jobs.CancelOutcome.REQUESTED
    for ctx, p in contexts:
        assert isinstance(_check_peers(db, ctx, p, joined=True, waited=0), JobCancelled)


def test_the_job_sums_its_nodes_throughput_and_merges_their_epochs(db: Settings) -> None:
    from mxq.db import jobs
    from mxq.db.chunks import settle_parent
    from mxq.db.fence import Fence
    from mxq.db.outputs import epochs

    parent, ids = _split_job(db.database)
    _run_parts(db, ids)
    for rank, (job_id, node, rate) in enumerate(zip(ids, "ab", (100.0, 300.0), strict=True)):
        for epoch in (1, 2):
            epochs.record(db.database, job_id, {
                "epoch": epoch, "train_loss": 1.0 + rank, "train_accuracy": 0.5, "val_accuracy": 0.9,
                "seconds": 2.0 + rank, "samples_per_sec": rate,
                "per_device": {f"cpu:0@{node}": rate},
                "checkpoint": "ck" if rank == 0 else None})
        result = {"rank": rank, "node": node, "devices": [f"cpu:0@{node}"], "model": "m",
                  "per_device": {f"cpu:0@{node}": rate}, "val_accuracy": 0.9, "epochs": 2,
                  **({"model_version": 1} if rank == 0 else {})}
        assert jobs.succeed(db.database, Fence(job_id, f"cpu0@{node}", 1), 1000, 1000 / rate, result)
    epochs.merge_parts(db.database, parent)  # a part merges after each epoch; settling again
    assert settle_parent(db.database, parent)
    done = _job(db.database, parent)
    assert done["status"] == "succeeded"
    assert done["samples_per_sec"] == pytest.approx(400.0) and done["samples"] == 2000
    merged: dict[str, Any] = done["result"] or {}
    assert done["model_version"] == 1 and merged["nodes"] == 2
    assert {n: v["samples_per_sec"] for n, v in merged["per_node"].items()} == \
        pytest.approx({"a": 100.0, "b": 300.0})
    assert done["devices"] == ["cpu:0@a", "cpu:0@b"]
    assert [e["epoch"] for e in done["epochs"]] == [1, 2]
    last = done["epochs"][-1]
    assert last["samples_per_sec"] == 400.0 and last["per_device"] == {"cpu:0@a": 100.0, "cpu:0@b": 300.0}
    assert last["train_loss"] == 1.5 and last["seconds"] == 3.0 and last["checkpoint"] == "ck"


def test_submit_refuses_more_nodes_than_have_the_devices() -> None:
    from mxq.workers.jobs.jobspecs import ParamsError, TrainParams, validate, validated
    from mxq.workers.jobs.kinds.train import check_nodes

    def asked(nodes: int, devices: int) -> TrainParams:
        return TrainParams.model_validate({**TRAIN, "nodes": nodes, "devices": devices})

    both = ["mxnet", "onnx"]
    # the fields of a worker's record that _check_nodes reads
    known = cast(list["WorkerRecord"], [{"node": "a", "device": "cpu:0", "engines": both},
             {"node": "a", "device": "cpu:1", "engines": both},
             {"node": "b", "device": "cpu:0", "engines": both},
             {"node": "c", "device": "gpu:0", "engines": ["onnx"]}])  # (an H200 trains nothing)
    check_nodes(known, asked(2, 1))
    with pytest.raises(ParamsError, match="3 nodes with 1 devices each asked but 2 nodes have"):
        check_nodes(known, asked(3, 1))
    with pytest.raises(ParamsError, match="2 nodes with 2 devices each asked but 1 nodes have"):
        check_nodes(known, asked(2, 2))
    with pytest.raises(ParamsError, match="names devices of one node, not of --nodes 2: use --devices K"):
        validate("train", {**TRAIN, "device_list": ["cpu:0"]})
    assert validated(TrainParams, {k: v for k, v in TRAIN.items() if k != "nodes"}).nodes == 1
