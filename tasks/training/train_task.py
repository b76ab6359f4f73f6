"""`train`: a K-device data-parallel training job.

The worker that takes the job leads it: it leases K devices of its node (its own first; on GPUs
the rest of its GPU model, closest in topology, then least loaded), waits until their workers are
idle, then runs the training in a child process pinned to exactly those devices
(`python -m mxq.tasks.training.train_child JOB DEVICES`), renewing the leases while the child
runs. The child checkpoints every epoch and resumes from the last one when the job is delivered
again after a crash.

With `nodes` N > 1 the job is split into one such training per node, joined by MXNet's dist_sync
kvstore: see tasks/training/dist.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, NoReturn

from mxq.db.fence import Fence
from mxq.db.fleet import describe_groups, gpu_model, list_workers, model_groups
from mxq.db.outputs import epochs as epoch_rows
from mxq.db.records import WorkerRecord
from mxq.device import Device
from mxq.errors import DeviceFault, device_fault
from mxq.tasks.inference import device_memory
from mxq.tasks.job_context import (
    FanOut,
    JobCancelled,
    JobContext,
    JobFailed,
    JobInputError,
    JobLost,
    JobPreempted,
    JobTimedOut,
    Outcome,
)
from mxq.tasks.middleware import job_log
from mxq.tasks.runner import job_task
from mxq.tasks.training import child_report, dist
from mxq.workers.broker.queues import pool_queues
from mxq.workers.fleet import leases, suspects
from mxq.workers.hardware.devices import EXCLUSIVE_PROCESS
from mxq.workers.hardware.pinning import cpu_cores
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.settings import Settings

CHILD_INPUT_ERROR = 3  # the child's exit status for bad input (its message is in the run file)
CHILD_CANCELLED = 4  # the child stopped at a boundary because the job was cancelled
CHILD_LOST = 5  # the job is no longer this attempt's (its fence refused a write): it stopped
CHILD_PREEMPTED = 6  # the child stopped at an epoch's checkpoint to yield to a waiting job
CHILD_TIMED_OUT = 7  # the child stopped at a batch or epoch: the job ran past its time limit
CHILD_HUNG = 8  # the child's watchdog found a batch stuck on the devices (a device fault, reported)
# A child killed by one of these without a report died in native code, as CUDA and the driver
# kill a process on a fatal device error (SIGABRT most often): the device's fault, not the job's.
DEVICE_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL}
RELAY_CHUNK = 65536  # the most of one line the relay reads at once (a longer one comes in pieces)
RELAY_JOIN_SECONDS = 5.0  # how long the relay may take to drain the pipes after the child ended
LEASE_TTL_FACTOR = 5  # a lease outlives this many missed renewals (heartbeats)


def lease_ttl(s: Settings) -> float:
    return s.heartbeat_seconds * LEASE_TTL_FACTOR


def choose_devices(s: Settings, p: TrainParams, own: str, movable: bool = False) -> list[str]:
    """This worker's device plus K-1 free live devices of the same kind on this node. On GPUs
    they are of `own`'s GPU model (data parallel steps at the pace of its slowest device: an A100
    beside an L4 would wait for it every step), the closest in the topology, then the least
    loaded (not running a job), then the lowest indexes. A device list the user gave is taken
    as it is, models mixed or not: that is their choice. `movable`: the job came from a pool, so
    another worker may lead it (see `model_mates`)."""
    if p.device_list:
        return list(p.device_list)
    me = Device.parse(own)
    mine = [w for w in list_workers(s.database, s.heartbeat_ttl, s.node)  # of its kind, running MXNet
            if Device.parse(w["device"]).kind == me.kind and "mxnet" in w["engines"]]
    _leave_exclusive(s, p, own, movable, mine)
    free = _free_devices(s, p, own, me.kind, movable, mine)
    if me.is_gpu and p.devices > 1:
        from mxq.workers.hardware.topology import closest, read_topology

        index = {w["device"]: Device.parse(w["device"]).index for w in free}
        picked = closest(read_topology(s.nvidia_smi), [*index.values(), me.index], p.devices,
                         must=me.index,
                         load={index[w["device"]]: int(w["current_job"] is not None) for w in free})
        return [own, *(f"gpu:{i}" for i in picked if f"gpu:{i}" != own)]
    return [own, *sorted((w["device"] for w in free), key=Device.parse)[:p.devices - 1]]


def _free_devices(s: Settings, p: TrainParams, own: str, kind: str, movable: bool,
                  mine: list[WorkerRecord]) -> list[WorkerRecord]:
    """The live, unleased devices of `mine` (the node's workers of `own`'s kind that run MXNet:
    an H200 beside A100s serves inference only; GPUs: of its model) besides `own`.
    JobInputError: the node has fewer than K such devices at all; LookupError: fewer are free
    now (wait)."""
    known = _known_devices(s, p, kind, mine)
    if kind == "gpu":
        known = model_mates(known, own, p.devices, movable, s.node)
    live = [w for w in known if w["alive"]]  # fewer live than asked: wait for restarts
    held = leases.holders(s.broker, s.node, [w["device"] for w in live])
    probing = suspects.pending(s.broker, s.node, [w["device"] for w in live])  # going out
    free = [w for w in live if held.get(w["device"]) is None and w["device"] != own
            and w["device"] not in probing]
    if len(free) + 1 < p.devices:
        raise LookupError(f"{p.devices} devices wanted, {len(free) + 1} free now")
    return free


def _known_devices(s: Settings, p: TrainParams, kind: str, mine: list[WorkerRecord]) -> list[WorkerRecord]:
    """The workers of `mine` (this node's of `kind` that run MXNet), live or not, but for GPUs
    in the Exclusive_Process compute mode (`exclusive`); JobInputError when they are fewer than
    K (waiting would never end: fail with what there is)."""
    known = [w for w in mine if not exclusive(w)]
    if len(known) < p.devices:
        raise JobInputError(f"{p.devices} devices asked but node {s.node} has {len(known)} "
                            f"{kind} devices that run MXNet "
                            f"({', '.join(w['device'] for w in known) or 'none'})")
    return known


def exclusive(worker: WorkerRecord) -> bool:
    """Whether `worker`'s GPU is in the Exclusive_Process compute mode (as nvidia-smi said when
    the launcher planned it): one process alone may hold a context there, and its worker holds
    one (MXNet 1.9.1 never lets go of it), so no training process can start on it."""
    return (worker["info"] or {}).get("compute_mode") == EXCLUSIVE_PROCESS


def exclusive_reason(devices: list[str]) -> str:
    """The one line a training on `devices` (GPUs in the Exclusive_Process mode) fails with."""
    return (f"{', '.join(devices)} {'is' if len(devices) == 1 else 'are'} in the Exclusive_Process "
            "compute mode, where one process alone may use a GPU: its worker does, so no training "
            "process can start there (inference and probes run in the worker and are served); set "
            "the Default compute mode (`nvidia-smi -i "
            f"{','.join(str(Device.parse(d).index) for d in devices)} -c DEFAULT`) to train on it")


def _leave_exclusive(s: Settings, p: TrainParams, own: str, movable: bool,
                     rows: list[WorkerRecord]) -> None:
    """When `own` is a GPU in the Exclusive_Process mode: a job from the pool goes back there
    (LookupError) for the node's other GPUs (of `rows`: its kind's that run MXNet) when they can
    run it, else fails (JobInputError)."""
    if not any(w["device"] == own and exclusive(w) for w in rows):
        return
    if movable and sum(not exclusive(w) for w in rows) >= p.devices:
        raise LookupError(f"{own} cannot train (Exclusive_Process compute mode); other GPUs of node "
                          f"{s.node} can take the job")
    raise JobInputError(exclusive_reason([own]))


def model_mates(known: list[WorkerRecord], own: str, k: int, movable: bool,
                node: str) -> list[WorkerRecord]:
    """Of `known` (a node's GPU workers that run MXNet), those of `own`'s GPU model: a training
    never mixes models on its own. Fewer than `k` of them: LookupError (the job goes back to its
    pool, for a worker of a model the node has `k` of) when the job is `movable` and such a
    model exists; else JobInputError (it could never run here)."""
    mine = next((w for w in known if w["device"] == own), None)
    model = gpu_model(mine) if mine is not None else None
    mates = [w for w in known if gpu_model(w) == model]
    if len(mates) >= k:
        return mates
    _too_few_mates(known, mates, f"{own} ({model or 'model unknown'})", own, k, movable, node)


def _too_few_mates(known: list[WorkerRecord], mates: list[WorkerRecord], name: str, own: str, k: int,
                   movable: bool, node: str) -> NoReturn:
    """Why `own` (`name`: with its model) cannot train on `k` GPUs of its model (`mates`): to
    wait for a worker of a model that has `k` (LookupError), or never here (JobInputError)."""
    groups = model_groups(known)
    able = [m for m, devices in groups.items() if len(devices) >= k]
    if movable and able:
        beside = sum(w["device"] != own for w in mates)
        raise LookupError(f"{k} devices of one GPU model wanted: {name} has {beside} of its "
                          f"model beside it; {' or '.join(able)} devices can take the job")
    why = ("a training never mixes GPU models (each step would wait for the slowest) unless "
           "--device lists them")
    if movable:
        raise JobInputError(f"{k} devices asked but node {node} has no {k} GPUs of one model that "
                            f"run MXNet ({describe_groups(groups)}): {why}")
    instead = f"; --device auto:gpu runs it on {' or '.join(able)} devices" if able else ""
    raise JobInputError(f"{k} devices asked on {name} but node {node} has {len(mates)} of that "
                        f"model that run MXNet ({describe_groups(groups)}): {why}{instead}")


def admit(job: JobContext) -> list[str] | None:
    """Lease the job's devices before it is claimed; None when they are not free yet.

    A multi-node job's leader leases nothing (it only splits the job): it waits until N nodes
    are live."""
    s = job.settings
    try:
        p = job.params(TrainParams)
        if p.nodes > 1 and p.dist is None:
            dist.choose_nodes(s, p, job.device)
            return [job.device]
        devices = choose_devices(s, p, job.device, _movable(job))
    except JobInputError:
        return [job.device]  # claim it; the body fails it with the message (choose_devices again)
    except LookupError:
        return None
    ok = leases.acquire(s.broker, s.node, devices, job.id, lease_ttl(s))
    return devices if ok else None


def _movable(job: JobContext) -> bool:
    """The job came from a pool of its kind, not from its device's own queue: another worker
    may lead it."""
    return job.queue in pool_queues(job.parsed_device.kind)


def release(job: JobContext) -> None:
    s = job.settings
    leases.release(s.broker, s.node, job.devices, job.id)


def _wait_idle(s: Settings, job: JobContext) -> None:
    """The other leased devices finish what they were running (they start nothing new)."""
    others = set(job.devices) - {job.device}
    while True:
        busy = [w for w in list_workers(s.database, s.heartbeat_ttl, s.node)
                if w["device"] in others and w["alive"] and w["current_job"] not in (None, job.id)]
        if not busy:
            return
        leases.renew(s.broker, s.node, job.devices, job.id, lease_ttl(s))
        time.sleep(s.heartbeat_seconds)


def child_env(s: Settings, devices: list[str]) -> tuple[dict[str, str], list[int]]:
    """The training child sees exactly the leased devices, in order (its contexts gpu(0).. are
    `devices`), or their CPU cores. GPUs as their workers are pinned (`cuda_visible_devices` of
    the launcher's device info: the UUID), never by an index CUDA may count differently."""
    env = dict(os.environ)
    if Device.parse(devices[0]).is_gpu:
        info = {w["device"]: w["info"] or {} for w in list_workers(s.database, s.heartbeat_ttl, s.node)}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(_pinned_as(info.get(d) or {}, d) for d in devices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # where an index remains, nvidia-smi's numbering
        return env, []
    cores = sorted({c for d in devices for c in cpu_cores(Device.parse(d).index, s.cpu_devices)})
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(len(cores)),
               MKL_NUM_THREADS=str(len(cores)), OPENBLAS_NUM_THREADS=str(len(cores)))
    return env, cores


def _pinned_as(info: dict[str, object], device: str) -> str:
    """What CUDA_VISIBLE_DEVICES names `device` by: as its worker is pinned; a row the launcher
    registered before that was recorded gives its UUID, else its index."""
    return str(info.get("cuda_visible_devices") or info.get("uuid") or Device.parse(device).index)


def run_file(s: Settings, fence: Fence) -> Path:
    """The child's report: one per attempt, so a paused attempt's child never writes another's."""
    return s.home_path / "runs" / f"job-{fence.job_id}.{fence.tag}.json"


def ready_file(s: Settings, job_id: int) -> Path:
    """Written by a multi-node part's child once its kvstore has joined (all nodes are in)."""
    return s.home_path / "runs" / f"job-{job_id}.ready"


@job_task("train", admit=admit, release=release)
def train(job: JobContext) -> Outcome | FanOut:
    s = job.settings
    p = job.params(TrainParams)
    if p.nodes > 1 and p.dist is None:
        return dist.split(s, job, p)
    _check_runnable(s, job, p)
    epoch_rows.set_devices(job.url, job.id, job.devices)
    _wait_idle(s, job)
    device_memory.give_back(job.parsed_device)  # the child trains on this worker's device too
    env, cores = child_env(s, job.devices)
    if p.dist is not None:
        env.update(dist.worker_env(s, p))
    assert job.fence is not None
    out, ready = run_file(s, job.fence), ready_file(s, job.id)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    ready.unlink(missing_ok=True)
    returncode = _run_child(s, job, p, env, cores, ready)
    return _outcome(returncode, out)


def _check_runnable(s: Settings, job: JobContext, p: TrainParams) -> None:
    """Fail what can never run here: float16 on CPUs, devices that could not be leased, a
    multi-node part delivered again."""
    if p.dtype == "float16" and not job.parsed_device.is_gpu:
        raise JobInputError("--dtype float16 needs GPUs: MXNet 1.9.1 has no fast float16 kernels "
                            "on the CPU; use --dtype float32 on CPU devices")
    if len(job.devices) != p.devices:
        choose_devices(s, p, job.device, _movable(job))  # raises why admit could not lease them
    if job.parsed_device.is_gpu:
        rows = list_workers(s.database, s.heartbeat_ttl, s.node)
        if held := [w["device"] for w in rows if w["device"] in job.devices and exclusive(w)]:
            raise JobInputError(exclusive_reason(held))
    if p.dist is not None:
        dist.check_first_run(s, job, p)


def _run_child(s: Settings, job: JobContext, p: TrainParams, env: dict[str, str], cores: list[int],
               ready: Path) -> int:
    """Run the training child (and, leading a multi-node job, its ps-lite roles) to its end,
    renewing the leases; kill it when a lease is lost or the job must stop."""
    roles: list[dist.Role] = []
    child: subprocess.Popen[bytes] | None = None
    threads: list[threading.Thread] = []

    def renew() -> None:
        if not leases.renew(s.broker, s.node, job.devices, job.id, lease_ttl(s)):
            _kill(child)
            raise RuntimeError(f"lost the lease on {', '.join(job.devices)} (expired and taken)")

    try:
        if p.dist is not None and p.dist.host:
            roles = dist.start_roles(s, p, cores)
        assert job.fence is not None
        child = subprocess.Popen([sys.executable, "-m", "mxq.tasks.training.train_child", str(job.id),
                                  ",".join(job.devices), str(job.fence.attempt), job.fence.worker],
                                 env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, preexec_fn=lambda: dist.die_with_parent(cores))
        threads = relays(child, job.id)
        if p.dist is not None:
            dist.watch(s, job, p, child, roles, ready, renew)
        while child.poll() is None:
            renew()
            time.sleep(s.heartbeat_seconds)
        return child.returncode
    finally:
        _kill(child)
        for relay in threads:
            relay.join(RELAY_JOIN_SECONDS)
        # after a clean end the scheduler and server stop by themselves; else they are killed
        clean = child is not None and child.returncode == 0
        dist.stop_roles(roles, dist.ROLE_EXIT_SECONDS if clean else 0)
        ready.unlink(missing_ok=True)


def relays(child: subprocess.Popen[bytes], job_id: int) -> list[threading.Thread]:
    """Threads that hand the child's stdout and stderr to the job's log (`tasks/middleware/job_log.py`)
    and echo them, as they come, to this worker's own (where the child's output went before)."""
    assert child.stdout is not None and child.stderr is not None
    threads = [threading.Thread(target=_relay, args=(stream, fd, job_id), daemon=True,
                                name=f"job-{job_id}-child-{fd}")
               for stream, fd in ((child.stdout, 1), (child.stderr, 2))]
    for thread in threads:
        thread.start()
    return threads


def _relay(stream: IO[bytes], fd: int, job_id: int) -> None:
    recorder = job_log.recorder(job_id)
    with stream:
        for chunk in iter(lambda: stream.readline(RELAY_CHUNK), b""):
            try:
                os.write(fd, chunk)
            except OSError:
                pass  # the worker's own output is gone: the log still gets the line
            if recorder is not None:
                recorder.add("child", chunk.decode(errors="replace"))


def _kill(child: subprocess.Popen[bytes] | None) -> None:
    if child is not None and child.poll() is None:
        child.kill()
        child.wait()


def _outcome(returncode: int, out: Path) -> Outcome:
    """The job's outcome from the child's exit status and the report it wrote to `out`, read as
    the shape that status says (`child_report.MalformedReport`, a JobFailed, when it does not fit)."""
    if returncode == 0:
        if (trained := child_report.read(out, child_report.Trained)) is None:
            raise JobFailed(f"the training process exited with 0 without its report {out.name}")
        return Outcome(samples=trained.samples, seconds=trained.seconds, result=trained.result)
    if returncode == CHILD_CANCELLED:
        stopped = child_report.read(out, child_report.Stopped)
        raise JobCancelled(stopped.samples if stopped is not None else None)
    if returncode == CHILD_PREEMPTED and (yielded := child_report.read(out, child_report.Preempted)):
        raise JobPreempted(yielded.to, yielded.samples)
    _refused(returncode, child_report.read(out, child_report.Refused))


# The child's exit statuses that say why it stopped, with the job's exception and its message
# when the child's report gives none.
_STOPPED_BY: dict[int, tuple[type[Exception], str]] = {
    CHILD_LOST: (JobLost, "the job was handed to another attempt"),
    CHILD_INPUT_ERROR: (JobInputError, "training input error"),
    CHILD_TIMED_OUT: (JobTimedOut, "time limit reached: the training stopped"),
}


def _refused(returncode: int, refused: child_report.Refused | None) -> NoReturn:
    """The exception of a child that failed (exit status `returncode`, its report `refused`):
    the device's when a device signal killed it or its error is a device fault, else the job's."""
    error = refused.error if refused is not None else None
    if refused is None and -returncode in DEVICE_SIGNALS:
        raise DeviceFault(f"the training process died by {signal.Signals(-returncode).name} during "
                          "its device work (as CUDA aborts a process on a fatal device error)")
    if (stopped := _STOPPED_BY.get(returncode)) is not None:
        raise stopped[0](error or stopped[1])
    if refused is not None and (refused.device_fault or device_fault(RuntimeError(refused.error))):
        # the device's (a CUDA error in the child): resumed elsewhere once the suspects are probed
        raise DeviceFault(refused.error, (refused.faulted,) if refused.faulted else ())
    raise JobFailed(error or f"training process exited with {returncode}")
