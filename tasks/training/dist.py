"""Multi-node training (`--nodes N`): MXNet's `dist_sync` kvstore over ps-lite.

The leader is the job's first delivery, on whichever node's worker took it from the pool. It
picks N live nodes (its own first: part 0 runs there), a free port on its host, and splits the
job into one part per node, each published to a device queue of its node, with the DMLC_*
settings in the part's params. Then it returns: the leader holds no lease and blocks no worker,
so on a node with a single device that device is free for the node's part (a solo worker that
waited for its parts could not also run one).

Each part is a one-node training job (K leased devices of its node) whose child process runs
with DMLC_ROLE=worker and trains on its shard (`kv.rank` of `kv.num_workers`). Part 0 also
starts the ps-lite scheduler and one server as child processes of its worker (killed with it).
Every part's worker watches the others: a part that failed or was cancelled, a node that stopped
beating, or nodes that have not all joined within MXQ_DIST_START_SECONDS stop the whole job
(its trainer and, on part 0, the scheduler and server are killed). A part is never retried: a
dist_sync training cannot take a replacement worker mid-run.

Every role binds the very address it announces, its node's MXQ_NODE_ADDRESS (ps-lite hands it
to ZeroMQ for both; there is no separate bind address): a node whose host does not own it (a
container's published address behind NAT) fails at once (`check_address`), and a container
takes part under host networking only.

The last part to finish settles the job (`db.chunks.settle_parent`): samples/s summed over the
nodes, per node in `result.per_node`, per device (`cpu:0@node`) in the epochs. Rank 0 registers
the model, once.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from mxq.db import peers
from mxq.db.fleet import gpu_model, list_workers
from mxq.db.outputs.epochs import set_devices
from mxq.db.records import WorkerRecord
from mxq.db.schema import utcnow
from mxq.device import Device
from mxq.parts import knock_on
from mxq.status import JobStatus
from mxq.tasks.job_context import FanOut, JobCancelled, JobContext, JobFailed, JobInputError, JobLost
from mxq.workers.broker.queues import device_queue
from mxq.workers.fleet import leases
from mxq.workers.jobs.jobspecs import DistRole, TrainParams
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)

ROLE_EXIT_SECONDS = 30.0  # after the training, the scheduler and server get this long to exit
LOG_TAIL_BYTES = 2000
SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address


def choose_nodes(s: Settings, p: TrainParams, own: str) -> list[tuple[str, str]]:
    """N (node, device) pairs: this node and device first, then the nodes with most idle devices.

    Every node's devices are of this device's kind and GPU model (`own`'s row): the whole
    training steps at the pace of its slowest GPU. JobInputError: fewer than N nodes have K
    such devices at all. LookupError: they do, but fewer are live now (the job waits, as for
    devices)."""
    by_node, label = _like_own(s, own)
    _check_big_enough(p, by_node, label)
    live, idle = _live_and_idle(s, by_node)
    ready = [n for n in live if len(live[n]) >= p.devices]
    if s.node not in ready or len(ready) < p.nodes:
        raise LookupError(f"{p.nodes} nodes with {p.devices} live {label} devices wanted, "
                          f"{len(ready)} now ({', '.join(sorted(ready)) or 'none'})")
    others = sorted((n for n in ready if n != s.node), key=lambda n: (-len(idle[n]), n))
    return [(s.node, own), *((node, min(idle[node] or live[node], key=Device.parse))
                             for node in others[:p.nodes - 1])]


def _like_own(s: Settings, own: str) -> tuple[dict[str, list[WorkerRecord]], str]:
    """Per node, the workers that can train of `own`'s kind and (when `own`'s row names one) GPU
    model, and the label of that kind or model in messages."""
    kind = Device.parse(own).kind
    by_node = _workers_by_node(s, kind)
    mine = next((w for w in by_node.get(s.node, []) if w["device"] == own), None)
    if mine is None:
        return by_node, kind
    model = gpu_model(mine)
    return {n: [w for w in ws if gpu_model(w) == model] for n, ws in by_node.items()}, model or kind


def _check_big_enough(p: TrainParams, by_node: dict[str, list[WorkerRecord]], label: str) -> None:
    """JobInputError when fewer than N nodes have K such devices at all, live or not."""
    big_enough = sum(len(ws) >= p.devices for ws in by_node.values())
    if big_enough < p.nodes:
        have = ", ".join(f"{n} ({len(ws)})" for n, ws in sorted(by_node.items())) or "none"
        raise JobInputError(f"{p.nodes} nodes with {p.devices} {label} devices each asked but only "
                            f"{big_enough} have that many; {label} devices per node: {have}")


def _workers_by_node(s: Settings, kind: str) -> dict[str, list[WorkerRecord]]:
    """Per node, its workers of `kind` that can train (MXNet runs their device)."""
    by_node: dict[str, list[WorkerRecord]] = {}
    for w in list_workers(s.database, s.heartbeat_ttl):
        if Device.parse(w["device"]).kind == kind and "mxnet" in w["engines"]:
            by_node.setdefault(w["node"], []).append(w)
    return by_node


def _live_and_idle(s: Settings, by_node: dict[str, list[WorkerRecord]]
                   ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per node, the devices whose worker is alive, and of those the ones neither running a job
    nor leased."""
    live: dict[str, list[str]] = {}
    idle: dict[str, list[str]] = {}
    for node, ws in by_node.items():
        up = [w for w in ws if w["alive"]]
        held = leases.holders(s.broker, node, [w["device"] for w in up])
        live[node] = [w["device"] for w in up]
        idle[node] = [w["device"] for w in up
                      if w["current_job"] is None and held.get(w["device"]) is None]
    return live, idle


def free_port(s: Settings) -> int:
    """A free port on this node's address, for the ps-lite scheduler; JobFailed when this host
    cannot bind that address (`address_refused`)."""
    try:
        with socket.socket() as sock:
            sock.bind((s.address, 0))
            return int(sock.getsockname()[1])
    except OSError as exc:
        raise JobFailed(address_refused(s, exc)) from None


def check_address(s: Settings) -> None:
    """Fail this node's part before its trainer starts when this host cannot bind its address:
    ps-lite would only say 'bind failed' (and, on part 0, the other nodes would wait for it)."""
    free_port(s)


def address_refused(s: Settings, exc: OSError) -> str:
    """Why this node cannot take part, in one line. ps-lite's roles bind the very address they
    announce (ZeroMQ binds DMLC_NODE_HOST; there is no separate bind address), so an address this
    host does not own, such as a container's published address behind NAT, cannot work: the fix is
    an address of the host itself, which a container has under host networking."""
    origin = ("MXQ_NODE_ADDRESS" if s.node_address else
              "the default route's interface, as MXQ_NODE_ADDRESS is unset")
    owned = ", ".join(host_addresses()) or "none found"
    return (f"node {s.node} cannot bind its address {s.address} ({origin}) for ps-lite: "
            f"{exc.strerror or exc}; ps-lite binds the address it announces, so "
            f"MXQ_NODE_ADDRESS must be an IPv4 address of this host that the other nodes reach "
            f"(this host has: {owned}); in a container, give the worker host networking "
            "(docker-compose.yml's worker service has it)")


def host_addresses() -> list[str]:
    """The IPv4 address of each of this host's interfaces that has one (SIOCGIFADDR), for the
    message above: what MXQ_NODE_ADDRESS may be."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            found.append(socket.inet_ntoa(packed[20:24]))
    return found


def split(s: Settings, job: JobContext, p: TrainParams) -> FanOut:
    """The leader's work: one part per chosen node, the DMLC settings in each part's params."""
    try:
        chosen = choose_nodes(s, p, job.device)
    except LookupError as exc:  # a node went down since admit looked
        raise JobFailed(f"{exc}; submit the job again") from None
    env = {"DMLC_PS_ROOT_URI": s.address, "DMLC_PS_ROOT_PORT": str(free_port(s)),
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": str(len(chosen))}
    parts = [p.model_copy(update={"dist": DistRole(parent=job.id, index=i, node=node, host=i == 0,
                                                   env=env)}) for i, (node, _) in enumerate(chosen)]
    queues = [device_queue(node, d.kind, d.index)
              for node, d in ((node, Device.parse(device)) for node, device in chosen)]
    set_devices(job.url, job.id, [f"{device}@{node}" for node, device in chosen])
    log.info("job %s: %s nodes (%s), scheduler at %s:%s", job.id, len(chosen),
             ", ".join(n for n, _ in chosen), env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"])
    return FanOut(parts, queues, [device for _, device in chosen])


def _role(p: TrainParams) -> DistRole:
    """This part's place in its multi-node training (set by the leader for every part)."""
    if p.dist is None:
        raise JobFailed("not a part of a multi-node training: no dist role")
    return p.dist


def check_first_run(s: Settings, job: JobContext, p: TrainParams) -> None:
    """A part delivered again (its worker died while it ran) cannot rejoin the training."""
    if peers.attempts(s.database, job.id) > 1:
        raise JobFailed(f"part {_role(p).index} on node {s.node} was interrupted (its worker "
                        "stopped while it ran): a dist_sync training cannot take a replacement "
                        "worker; submit the job again")


def worker_env(s: Settings, p: TrainParams) -> dict[str, str]:
    """What the part's training child adds to its environment (after `check_address`: a node
    that cannot bind its own address fails its part here, before any ps-lite process starts)."""
    check_address(s)
    return {**_role(p).env, "DMLC_ROLE": "worker", "DMLC_NODE_HOST": s.address,
            "PS_VERBOSE": os.environ.get("PS_VERBOSE", "0")}


@dataclass
class Role:
    name: str  # scheduler | server
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, self.log.stat().st_size - LOG_TAIL_BYTES))
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""


def die_with_parent(cores: list[int]) -> None:
    """Runs in a child before exec: killed with its worker, and pinned to `cores`."""
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if cores:
        os.sched_setaffinity(0, cores)


def start_roles(s: Settings, p: TrainParams, cores: list[int]) -> list[Role]:
    """The ps-lite scheduler and server (importing MXNet with DMLC_ROLE set runs them; through
    `mxq.tasks.runtimes.mx`, so a GPU install finds its CUDA libraries), as children of this worker: they die
    with it."""
    logs = s.home_path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    roles = []
    for name in ("scheduler", "server"):
        env = {**os.environ, **_role(p).env, "DMLC_ROLE": name, "DMLC_NODE_HOST": s.address,
               "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
               "PS_VERBOSE": os.environ.get("PS_VERBOSE", "0")}
        path = logs / f"job-{_role(p).parent}-{name}.log"
        with open(path, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-c", "import mxq.tasks.runtimes.mx"], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=lambda: die_with_parent(cores))
        roles.append(Role(name, proc, path))
    return roles


def stop_roles(roles: list[Role], grace: float = 0.0) -> None:
    """Wait up to `grace` seconds for the roles to end by themselves, then kill what is left."""
    deadline = time.monotonic() + grace
    for role in roles:
        try:
            role.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            role.proc.kill()
            role.proc.wait()


def _check_peers(s: Settings, job: JobContext, p: TrainParams, joined: bool,
                 waited: float) -> Exception | None:
    """Why this part must stop now, if it must: it is no longer this worker's, it was cancelled,
    a peer failed (or stalled, which fails it), or the peers did not all join in time."""
    parts = peers.parts_of(s.database, _role(p).parent)
    me = next(r for r in parts if r.id == job.id)
    if me.status != JobStatus.RUNNING or me.worker != job.worker:
        return JobLost(f"part {me.index} (job {job.id}) is {me.status} now")
    if me.cancel:
        return JobCancelled()
    now = utcnow()
    cutoff = now - timedelta(seconds=s.heartbeat_ttl)
    others = [o for o in parts if o.id != job.id]
    for o in others:
        if (failure := _peer_failure(s, o, now, cutoff)) is not None:
            return failure
    if not joined and waited > s.dist_start_seconds:
        return _not_joined(s, len(parts), others, cutoff)
    return None


def _peer_failure(s: Settings, o: peers.PartRow, now: datetime, cutoff: datetime) -> JobFailed | None:
    """A peer that failed, or whose worker died or stopped beating (then failed here)."""
    where = f"part {o.index} on node {o.node} (job {o.id})"
    if o.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        return JobFailed(knock_on(f"{where} {o.status}: {o.error}"))
    if o.status != JobStatus.RUNNING:
        return None
    if o.heartbeat_at is None:  # taken for dead already
        lost = f"its worker on node {o.node} died while running it"
    elif o.heartbeat_at < cutoff:
        lost = (f"its worker on node {o.node} stopped beating (no heartbeat for "
                f"{(now - o.heartbeat_at).total_seconds():.0f}s)")
    else:
        return None
    if not peers.fail_part(s.database, o.id, lost, cutoff):
        return None  # its heartbeat came back, or another part failed it first
    return JobFailed(knock_on(f"{where} failed: {lost}"))


def _not_joined(s: Settings, nodes: int, others: list[peers.PartRow], cutoff: datetime) -> JobFailed:
    """The start-up limit passed before every node joined: fail the parts that never started."""
    for o in others:
        if o.status == JobStatus.QUEUED:
            peers.fail_part(s.database, o.id, f"not started within {s.dist_start_seconds:g}s "
                            "(MXQ_DIST_START_SECONDS): its node's device was busy or down", cutoff)
    waiting = ", ".join(f"part {o.index} on node {o.node} {o.status}" for o in others) or "none"
    return JobFailed(f"the {nodes} nodes did not all join within "
                     f"{s.dist_start_seconds:g}s (MXQ_DIST_START_SECONDS); others: {waiting}")


def watch(s: Settings, job: JobContext, p: TrainParams, child: subprocess.Popen[bytes],
          roles: list[Role], ready: Path, renew: Callable[[], None]) -> None:
    """Until the training child exits: keep the leases, watch the roles and the other parts;
    raise (after killing the child) when the job must stop."""
    started = time.monotonic()
    joined = False

    def stop(exc: Exception) -> None:
        child.kill()
        child.wait()
        raise exc

    while child.poll() is None:
        renew()
        for role in roles:
            code = role.proc.poll()
            if code not in (None, 0):
                stop(JobFailed(f"the ps-lite {role.name} on node {s.node} exited with {code}: "
                               f"{role.tail() or 'see ' + str(role.log)}"))
        joined = joined or ready.exists()
        verdict = _check_peers(s, job, p, joined, time.monotonic() - started)
        if verdict is not None:
            log.warning("job %s: stopping: %s", job.id, verdict)
            stop(verdict)
        time.sleep(s.heartbeat_seconds)
