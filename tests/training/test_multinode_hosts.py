"""Multi-node training across hosts (issue 30, finding 6), for real: two network namespaces on
this machine stand for two hosts. A veth pair joins them, each end with its own address in a
private /24 and no other route, so the nodes reach each other, the broker and nothing else over
that link, exactly as two machines on a LAN would.

- Namespace A holds a private `redis-server` bound to A's address (the broker both nodes use
  over the link; this test reaches it through its unix socket) and node hostA's launcher.
- Namespace B holds node hostB's launcher.
- The database is SQLite on the shared filesystem (namespaces share it).

Each launcher is `mxq worker` with one CPU device and `MXQ_NODE_ADDRESS` set to its own veth
address. A 2-node training must succeed with its parts on both nodes, each node's ps-lite roles
on its own address. Then hostB announces an address it does not own (what a container behind a
published port would announce): ps-lite binds the address it announces (ZeroMQ binds
DMLC_NODE_HOST; there is no separate bind address, tasks/training/dist.address_refused), so that cannot
work; the job must fail at once in one line naming MXQ_NODE_ADDRESS and the fix (host
networking), with no ps-lite process left behind.

Needs root and `ip` (iproute2) and `redis-server`: skipped without them, failed when CI is set.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mxq.db import peers
from mxq.db.fleet import alive_since, list_workers
from mxq.db.registry import list_models
from mxq.db.reports.history import get_job, require_job
from mxq.db.schema import utcnow
from mxq.json_types import JsonObject
from mxq.tasks.job_context import JobFailed
from mxq.tasks.training import dist
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.jobs.submit import submit
from mxq.workers.launch import groups
from mxq.workers.settings import Settings
from tests.conftest import FINAL, ROOT, Templates, missing, wait_until

NET = "10.231.0"  # private, and only inside the two namespaces: the host's routes never see it
ADDRESS = {"hostA": f"{NET}.1", "hostB": f"{NET}.2"}
NODES = tuple(ADDRESS)
UNOWNED = f"{NET}.3"  # on the link, owned by neither namespace: a published address behind NAT
REDIS_PORT = 6379  # inside namespace A: taken by nothing else there
EPOCHS = 3
TRAIN: JsonObject = {"arch": "mlp", "dataset": "digits", "epochs": EPOCHS, "seed": 1, "nodes": 2}


@dataclass
class Hosts:
    """The two namespaces (node -> namespace), the broker in A, the shared database, and the
    launchers running (node -> process, and the address it announces)."""

    netns: dict[str, str]
    veth: dict[str, str]
    home: Path
    redis: subprocess.Popen | None = None
    launchers: dict[str, subprocess.Popen] = field(default_factory=dict)
    announced: dict[str, str] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.home / "redis.sock"

    @property
    def database(self) -> str:
        return f"sqlite:///{self.home / 'mxq.db'}"

    @property
    def settings(self) -> Settings:
        """This test's own view: the same broker (through its unix socket) and database."""
        return Settings(home=self.home / "tester", broker_url=f"redis+socket://{self.socket}",
                        database_url=self.database, node="tester", heartbeat_seconds=0.5)

    def node_env(self, node: str, address: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
        env.update({"MXQ_NODE": node, "MXQ_CPU_DEVICES": "1", "MXQ_HOME": str(self.home / node),
                    "MXQ_BROKER_URL": f"redis://{ADDRESS['hostA']}:{REDIS_PORT}/0",
                    "MXQ_DATABASE_URL": self.database, "MXQ_NODE_ADDRESS": address,
                    "MXQ_DATA_ROOT": str(self.home / "data"),
                    "MXQ_NVIDIA_SMI": str(ROOT / "no-such-nvidia-smi"),
                    "MXQ_HEARTBEAT_SECONDS": "0.5", "MXQ_DIST_START_SECONDS": "60",
                    "PS_VERBOSE": "1"})  # the ps-lite scheduler logs each node's address
        return env


def ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"ip {' '.join(args)}: {proc.stderr.strip()}"
    return proc.stdout


def _needs() -> None:
    """Root (namespaces, veth) and the programs; skipped without them, a failure in CI."""
    if os.geteuid() != 0:
        missing("two network namespaces need root (ip netns add)")
    for program in ("ip", "redis-server"):
        if shutil.which(program) is None:
            missing(f"no `{program}` on PATH (iproute2, redis-server)")


def _link(h: Hosts) -> None:
    """The two namespaces, lo up in each, and one veth pair between them: .1 in A, .2 in B. A
    root without the capabilities (a container not given them) cannot: a skip, as for `ip`."""
    for ns in h.netns.values():
        made = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=30)
        if made.returncode != 0:
            missing(f"cannot create a network namespace: {made.stderr.strip()}")
    a, b = NODES
    ip("link", "add", h.veth[a], "type", "veth", "peer", "name", h.veth[b])
    for node, ns in h.netns.items():
        ip("link", "set", h.veth[node], "netns", ns)
        ip("-n", ns, "addr", "add", f"{ADDRESS[node]}/24", "dev", h.veth[node])
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "set", h.veth[node], "up")


def _start_redis(h: Hosts) -> subprocess.Popen:
    """The broker: a private redis-server in A, on A's address (for the nodes) and on a unix
    socket (for this test, outside both namespaces). Nothing persisted."""
    with open(h.home / "redis.log", "wb") as log:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", h.netns["hostA"], "redis-server", "--bind", ADDRESS["hostA"],
             "--port", str(REDIS_PORT), "--unixsocket", str(h.socket), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT)
    wait_until(lambda: proc.poll() is None and h.socket.exists(), 30, "redis-server to listen",
               interval=0.1)
    return proc


def start_node(h: Hosts, node: str, address: str) -> subprocess.Popen:
    """`mxq worker` for `node` inside its namespace, on a core of its own, in a process group of
    its own; returns once its worker beats."""
    since = utcnow()
    cores = sorted(os.sched_getaffinity(0))
    pin = {cores[NODES.index(node) % len(cores)]}
    (h.home / node).mkdir(parents=True, exist_ok=True)
    log_path = h.home / f"launcher-{node}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", h.netns[node], sys.executable, "-m",
                                 "mxq.cli", "worker"], cwd=ROOT, env=h.node_env(node, address),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, pin))
    h.launchers[node], h.announced[node] = proc, address

    def alive() -> set[str]:
        assert proc.poll() is None, f"launcher of {node} exited: {log_path.read_text()[-3000:]}"
        return alive_since(h.database, [f"cpu0@{node}"], since, 5.0)

    wait_until(alive, 180, f"cpu0@{node} to beat", until=lambda names: names == {f"cpu0@{node}"},
               interval=0.2)
    return proc


def node_at(h: Hosts, node: str, address: str) -> None:
    """`node` running and announcing `address` (its launcher restarted if it announces another)."""
    if h.announced.get(node) != address or h.launchers[node].poll() is not None:
        stop_node(h, node)
        start_node(h, node, address)


def stop_node(h: Hosts, node: str) -> None:
    """Its launcher stops (SIGTERM, else SIGKILL), then whatever its groups left."""
    proc = h.launchers.pop(node, None)
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    groups.end_recorded(h.home / node, node)


def _end_namespace(ns: str) -> None:
    """Kill what is left in the namespace (only this test's processes live in it), delete it:
    its veth end goes with it, and the peer end with that."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """Both namespaces linked, the broker and the database up, and a node in each namespace
    announcing its own address; all of it removed afterwards, whatever happened."""
    _needs()
    tag = os.getpid()
    h = Hosts(netns={n: f"mxq-{tag}-{n[-1].lower()}" for n in NODES},
              veth={n: f"mxq{tag}{n[-1].lower()}" for n in NODES},
              home=Path(tempfile.mkdtemp(prefix="mxq-hosts-")))  # short: the socket's path
    try:
        _link(h)
        Templates.sqlite_copy(h.home)
        (h.home / "data").mkdir()
        h.redis = _start_redis(h)
        for node in NODES:
            start_node(h, node, ADDRESS[node])
        yield h
    finally:
        for node in NODES:
            stop_node(h, node)
        if h.redis is not None:
            h.redis.kill()
            h.redis.wait()
        for ns in h.netns.values():
            _end_namespace(ns)
        shutil.rmtree(h.home, ignore_errors=True)


def _finished(h: Hosts, job_id: int, timeout: float) -> dict:
    """The job's record (with its epochs) once it has finished."""
    wait_until(lambda: require_job(h.database, job_id), timeout, f"job {job_id} to finish",
               until=lambda r: r["status"] in FINAL, interval=0.25)
    return dict(get_job(h.database, job_id, with_metrics=True) or {})


def _role_pids(port: str) -> list[int]:
    """Processes whose environment names the job's ps-lite port (its roles and trainers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"DMLC_PS_ROOT_PORT={port}".encode() in (
                    entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _nodes_seen_by_scheduler(log: Path) -> dict[str, set[str]]:
    """role -> addresses, from the ps-lite scheduler's log (PS_VERBOSE=1: 'assign rank=… to node
    role=worker, ip=10.231.0.2, port=…')."""
    seen: dict[str, set[str]] = {}
    for role, address in re.findall(r"assign rank=\d+ to node role=(\w+), ip=([\d.]+)", log.read_text()):
        seen.setdefault(role, set()).add(address)
    return seen


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_hosts_train_over_their_own_addresses(hosts: Hosts) -> None:
    h = hosts
    for node in NODES:
        node_at(h, node, ADDRESS[node])
    job_id = submit(h.settings, "train", {**TRAIN, "name": "xhost"}, "auto")
    job = _finished(h, job_id, 150)
    assert job["status"] == "succeeded", job["error"]
    leader = job["node"]
    parts = [require_job(h.database, p.id) for p in peers.parts_of(h.database, job_id)]
    assert [(p["node"], p["status"]) for p in parts] == [
        (leader, "succeeded"), *[(n, "succeeded") for n in NODES if n != leader]]
    assert {p["queue"] for p in parts} == {f"{n}.cpu.0" for n in NODES}
    assert set(job["result"]["per_node"]) == set(NODES), job["result"]
    assert sorted(job["devices"]) == [f"cpu:0@{n}" for n in NODES]
    assert [e["epoch"] for e in job["epochs"]] == list(range(1, EPOCHS + 1))
    # the scheduler (on the leader) is on the leader's own address, and every node's ps-lite
    # worker announced its own namespace's address: the training crossed the link
    env = parts[0]["params"]["dist"]["env"]
    assert env["DMLC_PS_ROOT_URI"] == ADDRESS[leader] and env["DMLC_NUM_WORKER"] == "2"
    seen = _nodes_seen_by_scheduler(h.home / leader / "logs" / f"job-{job_id}-scheduler.log")
    assert seen == {"worker": set(ADDRESS.values()), "server": {ADDRESS[leader]}}, seen
    (model,) = list_models(h.database, "xhost")  # registered once, by rank 0
    assert model["source"] == f"train:job-{job_id}"
    # nothing else was needed: two device workers, no schedule process, no roles left
    assert {w["name"] for w in list_workers(h.database, 5.0)} == {f"cpu0@{n}" for n in NODES}
    wait_until(lambda: _role_pids(env["DMLC_PS_ROOT_PORT"]), 30, "the job's ps-lite processes to exit",
               until=lambda pids: not pids, interval=0.2)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("leader", NODES)
def test_a_node_announcing_an_address_it_does_not_own_fails_in_one_line(hosts: Hosts, leader: str) -> None:
    """What a container behind a published port would do: announce the host's address, which
    its network namespace does not have. ps-lite cannot bind it, so the job fails at once,
    saying so (before: ps-lite's 'bind failed' in the trainer, or the other node waiting for the
    scheduler). Led by hostA, hostB's part fails before its trainer starts; led by hostB, the
    split fails before any part is queued."""
    h = hosts
    node_at(h, "hostA", ADDRESS["hostA"])
    node_at(h, "hostB", UNOWNED)
    there = h.settings.model_copy(update={"node": leader})
    job_id = submit(there, "train", {**TRAIN, "name": f"unowned-{leader.lower()}"}, "cpu:0")
    job = _finished(h, job_id, 90)
    assert job["status"] == "failed" and job["node"] == leader, job
    error = job["error"]
    print(f"led by {leader}: {error}")
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert f"node hostB cannot bind its address {UNOWNED} (MXQ_NODE_ADDRESS)" in error, error
    assert f"(this host has: 127.0.0.1, {ADDRESS['hostB']})" in error, error
    assert "host networking" in error, error
    parts = peers.parts_of(h.database, job_id)
    if leader == "hostB":
        assert parts == []  # refused at the split: nothing was queued for hostA
    else:  # hostA's part (scheduler, server, trainer) was stopped, and nothing is left running
        assert [(p.node, p.status) for p in parts] == [("hostA", "failed"), ("hostB", "failed")]
        assert parts[0].error is not None and parts[0].error.startswith("stopped because part 1")
        port = require_job(h.database, parts[0].id)["params"]["dist"]["env"]["DMLC_PS_ROOT_PORT"]
        wait_until(lambda: _role_pids(port), 30, "the job's ps-lite processes to exit",
                   until=lambda pids: not pids, interval=0.2)
    assert list_models(h.database, f"unowned-{leader.lower()}") == []


# The refusal itself, on this host, without namespaces.

def test_an_address_this_host_does_not_own_is_refused_before_ps_lite_starts() -> None:
    s = Settings(node="box2", node_address="192.0.2.7")  # TEST-NET-1: no host has it
    with pytest.raises(JobFailed) as caught:
        dist.worker_env(s, TrainParams.model_validate(
            {**TRAIN, "name": "m", "dist": {"parent": 1, "index": 1, "node": "box2", "host": False,
                                            "env": {}}}))
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith("node box2 cannot bind its address 192.0.2.7 (MXQ_NODE_ADDRESS) "
                              "for ps-lite: Cannot assign requested address; "), message
    assert "127.0.0.1" in message and "host networking" in message, message


def test_an_owned_address_is_announced_as_dmlc_node_host() -> None:
    s = Settings(node="box1", node_address="127.0.0.1")
    env = dist.worker_env(s, TrainParams.model_validate(
        {**TRAIN, "name": "m", "dist": {"parent": 1, "index": 0, "node": "box1", "host": True,
                                        "env": {"DMLC_PS_ROOT_URI": "127.0.0.1"}}}))
    assert env["DMLC_NODE_HOST"] == "127.0.0.1" and env["DMLC_ROLE"] == "worker"
    assert 0 < dist.free_port(s) < 65536
