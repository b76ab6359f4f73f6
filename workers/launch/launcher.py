"""`mxq worker`: one real `celery worker` process per device of this node, supervised.

Each child is pinned before it imports MXNet: `CUDA_VISIBLE_DEVICES=<GPU UUID>` for a GPU, CPU-core
affinity and thread limits for a CPU device, and the host memory cap `MXQ_WORKER_MEMORY_MB` when
set. A child that crashes is restarted (with backoff) and the jobs it held are requeued; one that
refused its device, or whose device failed mid-job, is started again later (MXQ_REPROBE_SECONDS,
doubling), so a device that heals comes back; SIGTERM
or Ctrl-C stops all children cleanly. With the embedded broker, the launcher also restarts the
embedded Redis when it dies (it runs daemonized, outside the launcher's groups, so that it
outlives a restart of the stack's processes).
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from mxq.db import fleet as beats
from mxq.workers.broker.queues import CONTROL_QUEUE, device_queue, pool_queues, worker_name
from mxq.workers.hardware import wheels
from mxq.workers.hardware.devices import (
    NVRTC_MIN_DRIVER,
    DiscoveredDevice,
    compute_mode_refusal,
    engines_for,
    fusion_off,
    incompatibility,
    memory_busy,
    onnx_driver_gate,
    onnx_runs_gpus,
)
from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT, THREAD_VARS, cpu_cores
from mxq.workers.hardware.unplanned import Unplanned, reasons
from mxq.workers.launch import groups, procs, sqlite_lock
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.repair.recovery import recover_worker
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
STOP_GRACE_SECONDS = 30.0  # warm shutdown waits for the running job; then it is killed
MAX_BACKOFF_SECONDS = 30.0
# A worker that refused its device is started again after MXQ_REPROBE_SECONDS, twice as long
# after each refusal up to REPROBE_MAX_SECONDS: a GPU that heals (reset, driver reloaded) comes
# back, and the jobs queued to it run, with no one restarting the node.
REPROBE_MAX_SECONDS = 1800.0
STABLE_SECONDS = 60.0  # a worker running this long has its crash and refusal counts forgotten


@dataclass
class WorkerSpec:
    device: DiscoveredDevice | None  # None: the schedule process
    name: str
    queues: list[str]
    command: list[str]
    env: dict[str, str]
    cores: list[int] = field(default_factory=list)
    engines: tuple[str, ...] = ()  # what its device runs: the engine pools it consumes


def worker_env(settings: Settings, device: DiscoveredDevice, cores: list[int],
               mxnet_unusable: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "MXQ_DEVICE": device.label, "MXQ_NODE": settings.node,
        "MXQ_HOME": str(settings.home_path), "MXQ_BROKER_URL": settings.broker,
        "MXQ_DATABASE_URL": settings.database, "PYTHONUNBUFFERED": "1",
    })
    if device.kind == "gpu":
        # By UUID: that exact GPU is the worker's context 0, whatever order CUDA counts in; the
        # order still matters where an index remains (a listing without UUIDs), and to children.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # nvidia-smi's numbering
        env["CUDA_VISIBLE_DEVICES"] = device.cuda_id
        env["MXQ_DEVICE_MODEL"] = device.model  # figures are kept per GPU model
        if mxnet_unusable:
            env["MXQ_MXNET_UNUSABLE"] = mxnet_unusable
        elif fusion_off(device):
            env["MXNET_USE_FUSION"] = "0"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU worker must not touch a GPU
        env["MXNET_CPU_WORKER_NTHREADS"] = "1"
        for var in THREAD_VARS:
            env[var] = str(len(cores))
    return env


# What a second environment must hold to serve GPUs MXNet cannot run (MXQ_ONNX_PYTHON).
ONNX_PYTHON_PROBE = ("import importlib.metadata as m; "
                     "print(m.version('onnxruntime-gpu'), m.version('mxq'))")
ONNX_PYTHON_TIMEOUT = 60


def onnx_python(settings: Settings) -> tuple[str, str | None]:
    """The Python that runs the workers of GPUs MXNet cannot run (an H200's), and why it cannot
    serve them (None: it can): MXQ_ONNX_PYTHON, a second environment holding the gpu-onnx extra
    (it never shares one with `gpu`: mxq.workers.hardware.wheels), else this one."""
    if settings.onnx_python is None:
        if onnx_runs_gpus():
            return sys.executable, None
        return sys.executable, ("to serve inference on it, install the gpu-onnx extra in an "
                                "environment of its own and set MXQ_ONNX_PYTHON to its python "
                                "(docs/gpu-hosts.md)")
    try:
        proc = subprocess.run([settings.onnx_python, "-c", ONNX_PYTHON_PROBE], capture_output=True,
                              text=True, timeout=ONNX_PYTHON_TIMEOUT)
        said = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc, said = None, str(exc)
    if proc is not None and proc.returncode == 0:
        return settings.onnx_python, None
    return settings.onnx_python, (f"MXQ_ONNX_PYTHON={settings.onnx_python} cannot serve it ({said[:200]}): "
                                  "install mxq with the gpu-onnx extra there (pip install -e "
                                  "'.[gpu-onnx]')")


def plan(settings: Settings, devices: list[DiscoveredDevice], build: str | None) -> tuple[list[WorkerSpec],
                                                                            list[str]]:
    """The worker to start for each usable device, and why the others are refused."""
    specs, unplanned = plan_devices(settings, devices, build)
    return specs, reasons(unplanned)


def plan_devices(settings: Settings, devices: list[DiscoveredDevice],
                 build: str | None) -> tuple[list[WorkerSpec], list[Unplanned]]:
    """The worker to start for each usable device, and each refused one with why (`Unplanned`)."""
    cpus = [d for d in devices if d.kind == "cpu"]
    if len(cpus) < len(devices) and (broken := wheels.problems()):
        why = "; ".join(f"every GPU of this host: {problem}" for problem in broken)
        return [], [Unplanned(d, "wheels", why) for d in devices if d.kind == "gpu"]
    specs: list[WorkerSpec] = []
    refused: list[Unplanned] = []
    # The ONNX Runtime Python is asked for once, for the first GPU MXNet cannot run.
    onnx = functools.cache(functools.partial(onnx_python, settings))
    for device in devices:
        runtime = _runtime(device, build, onnx)
        if isinstance(runtime, Unplanned):
            refused.append(runtime)
            continue
        specs.append(_worker_spec(settings, device, len(cpus), runtime.mxnet_unusable,
                                  runtime.python, runtime.engines))
    return specs, refused


class Runtime(NamedTuple):
    """What a device's worker runs: its Python, its engines, and why MXNet cannot (None: it can)."""

    python: str
    engines: tuple[str, ...]
    mxnet_unusable: str | None


def _runtime(device: DiscoveredDevice, build: str | None,
             onnx: Callable[[], tuple[str, str | None]]) -> Runtime | Unplanned:
    """The runtime of `device`'s worker, or why the device is refused."""
    if busy := memory_busy(device):
        return Unplanned(device, "memory_in_use", busy)
    if prohibited := compute_mode_refusal(device):
        return Unplanned(device, "compute_mode", prohibited)
    mxnet_unusable = incompatibility(device, build) if device.kind == "gpu" else None
    if mxnet_unusable:
        return _onnx_runtime(device, mxnet_unusable, onnx())
    if device.kind == "gpu" and fusion_off(device):
        log.warning("%s: driver %s is older than R%s, which the PTX of NVRTC 11.8 needs: its "
                    "worker runs with MXNet's kernel fusion off (MXNET_USE_FUSION=0)",
                    device.label, device.driver_version, NVRTC_MIN_DRIVER)
    return Runtime(sys.executable, engines_for(device.kind), None)


def _onnx_runtime(device: DiscoveredDevice, mxnet_unusable: str,
                  onnx: tuple[str, str | None]) -> Runtime | Unplanned:
    """A GPU MXNet cannot run serves inference with ONNX Runtime (the `onnx` Python, and why
    it cannot when it cannot), unless it is a MIG slice or its driver is too old for it."""
    python, cannot = onnx
    too_old, warning = onnx_driver_gate(device)
    if device.mig:
        return Unplanned(device, "mig", mxnet_unusable)
    if cannot or too_old:
        return Unplanned(device, "mxnet_build" if cannot else "driver",
                         f"{mxnet_unusable}; {cannot or too_old}")
    if warning:
        log.warning("%s", warning)
    log.warning("%s; it serves inference with ONNX Runtime (%s) and refuses training",
                mxnet_unusable, python)
    return Runtime(python, ("onnx",), mxnet_unusable)


def _worker_spec(settings: Settings, device: DiscoveredDevice, cpu_count: int, mxnet_unusable: str | None,
                 python: str, engines: tuple[str, ...]) -> WorkerSpec:
    name = worker_name(settings.node, device.kind, device.index)
    queues = [device_queue(settings.node, device.kind, device.index),
              *pool_queues(device.kind, engines)]
    cores = cpu_cores(device.index, cpu_count) if device.kind == "cpu" else []
    command = [python, "-m", "celery", "-A", "mxq.workers", "worker", "--pool", "solo",
               "--concurrency", "1", "--prefetch-multiplier", "1", "-Q", ",".join(queues),
               "-n", name, "--without-gossip", "--without-mingle", "-E", "-l", "INFO"]
    return WorkerSpec(device, name, queues, command,
                      worker_env(settings, device, cores, mxnet_unusable), cores, engines)


def schedule_spec(settings: Settings) -> WorkerSpec:
    """The schedule process: Celery beat plus one worker for the control queue (the tick)."""
    name = f"schedule@{settings.node}"
    command = [sys.executable, "-m", "celery", "-A", "mxq.workers", "worker", "-B", "--pool", "solo",
               "--concurrency", "1", "-Q", CONTROL_QUEUE, "-n", name, "--without-gossip",
               "--without-mingle", "-l", "INFO",
               "-s", str(settings.home_path / "celerybeat-schedule")]
    env = {k: v for k, v in worker_env(settings, DiscoveredDevice("cpu", 0), []).items()
           if k not in ("MXQ_DEVICE", *THREAD_VARS)}
    return WorkerSpec(None, name, [CONTROL_QUEUE], command, env)


def api_spec(settings: Settings) -> WorkerSpec:
    """The HTTP API and dashboard (`mxq api`)."""
    env = {k: v for k, v in worker_env(settings, DiscoveredDevice("cpu", 0), []).items()
           if k not in ("MXQ_DEVICE", *THREAD_VARS)}
    return WorkerSpec(None, f"api@{settings.node}", [], [sys.executable, "-m", "mxq.cli", "api"], env)


def preexec(cores: list[int], memory_mb: int | None) -> Callable[[], None] | None:
    """What a device worker runs between fork and exec: its core affinity, its memory cap.

    The cap is RLIMIT_DATA (heap and anonymous mappings, so MXNet's buffers): an allocation
    beyond it fails inside MXNet ("Failed to allocate CPU Memory"), which the job survives.
    RLIMIT_AS would also count the address space MXNet and its threads only reserve.
    """
    if not cores and memory_mb is None:
        return None

    def pin() -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        if memory_mb is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            cap = memory_mb * 2**20
            resource.setrlimit(resource.RLIMIT_DATA,
                               (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    return pin


@dataclass
class Child:
    spec: WorkerSpec
    proc: subprocess.Popen[bytes] | None = None
    leader: procs.Proc | None = None  # proc's identity, as the groups file records it
    crashes: int = 0
    restart_at: float = 0.0
    refused: bool = False
    refusals: int = 0  # in a row: how long until its device is probed again
    stopped_holding_since: float | None = None  # when it was first seen stopped with the lock


class Launcher:
    """Starts, watches and stops the device workers of this node."""

    def __init__(self, settings: Settings, specs: list[WorkerSpec],
                 recheck: Callable[[], list[WorkerSpec]] | None = None) -> None:
        self.settings = settings
        self.children = [Child(spec) for spec in specs]
        # GPUs planned no worker (refused at planning, missing from nvidia-smi): asked at each
        # poll for the workers of those that became usable (mxq.workers.launch.recheck)
        self.recheck = recheck
        self.stopping = False
        self.logs = settings.home_path / "logs"
        self.redis = EmbeddedRedis(settings.home_path) if settings.embedded_broker else None
        self.redis_retry_at = 0.0
        self.redis_failures = 0

    def _start(self, child: Child) -> None:
        spec = child.spec
        self.logs.mkdir(parents=True, exist_ok=True)
        out = open(self.logs / f"{spec.name.replace('@', '-')}.log", "ab")
        memory_mb = self.settings.worker_memory_mb if spec.device is not None else None
        child.proc = subprocess.Popen(  # its own session and group: its tree ends with it
            spec.command, env=spec.env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, preexec_fn=preexec(spec.cores, memory_mb),
            start_new_session=True,
        )
        out.close()
        child.leader = procs.started(child.proc.pid, spec.command)
        groups.record(self.settings.home_path, self.settings.node,
                      [c.leader for c in self.children if c.proc and c.leader])
        log.info("started %s (pid %s) on %s, queues %s", spec.name, child.proc.pid,
                 spec.device.label if spec.device else "no device", ",".join(spec.queues))

    def _register(self) -> None:
        for c in self.children:
            s = c.spec
            if s.device is None:
                continue
            beats.register(self.settings.database, s.name, self.settings.node, s.device.label,
                           s.queues[0], None, s.device.info(), alive=False, engines=s.engines)

    def _on_exit(self, child: Child, code: int) -> None:
        name = child.spec.name
        recovered = self._recover(child)
        if code == REFUSED_EXIT:
            child.refused, child.refusals = True, child.refusals + 1
            reason = self._refusal(child)
            if child.spec.device is not None:
                beats.refuse(self.settings.database, name, reason)
            first = self.settings.reprobe_seconds
            delay = min(max(REPROBE_MAX_SECONDS, first), first * 2 ** (child.refusals - 1))
            child.restart_at = time.monotonic() + delay
            log.error("%s refused to start: %s; probing its device again in %.0fs", name, reason, delay)
            return
        child.refusals = 0
        child.crashes += 1
        delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** (child.crashes - 1))
        child.restart_at = time.monotonic() + delay
        log.warning("%s exited with %s (jobs requeued: %s); restarting in %.1fs",
                    name, code, recovered or "none", delay)

    def _refusal(self, child: Child) -> str:
        """The reason a worker printed when it refused its device (the last such line of its log)."""
        path = self.logs / f"{child.spec.name.replace('@', '-')}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        said = [ln.split(REFUSAL_PREFIX, 1)[1] for ln in lines if REFUSAL_PREFIX in ln]
        return said[-1].strip() if said else f"see {path}"

    def run(self) -> int:
        """Supervise until stopped; 0 on a clean stop. A node whose every device is out keeps
        its launcher and probes them again (it exited, and under Compose was restarted and told
        `device.out` again at every restart); a device that passes is back. 1 at once when it
        has nothing to supervise (no device could be planned, and none to plan again)."""
        if not self.children and self.recheck is None:
            return 1
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        self._register()
        for child in self.children:
            self._start(child)
        while not self.stopping:
            self._watch()
            time.sleep(POLL_SECONDS)
        self._stop_all()
        return 0

    def _watch(self) -> None:
        now = time.monotonic()
        self._watch_broker(now)
        self._end_stopped_writer(now)
        for spec in self.recheck() if self.recheck else []:
            if all(c.spec.name != spec.name for c in self.children):
                self.children.append(Child(spec))  # started below, as any child due to start
        for child in self.children:
            if child.refused and now < child.restart_at:
                continue
            if child.refused:  # probed again: it starts, or refuses for longer
                child.refused = False
            if child.proc is None:
                if now >= child.restart_at:
                    self._start(child)
                continue
            code = child.proc.poll()
            if code is not None:
                strays = groups.end(child.proc.pid)  # what it started and left behind
                if strays:
                    log.warning("%s left %d processes behind; ended them", child.spec.name, strays)
                child.proc = None
                self._on_exit(child, code)
            elif (child.crashes or child.refusals) and now - child.restart_at > STABLE_SECONDS:
                # running for a while: forget old crashes, and the refusals that lengthen the
                # next probe's wait (never reset, every outage cost 30 minutes after a few)
                child.crashes = child.refusals = 0

    def _end_stopped_writer(self, now: float) -> None:
        """Kill the group of a child stopped while it holds the SQLite database's write lock for
        longer than the heartbeat TTL: every writer of the stack waits behind it, and only its
        death frees the lock (mxq.workers.launch.sqlite_lock). Its transaction rolls back; the child is then
        reaped, its jobs requeued and it is restarted like any other that died."""
        holder = sqlite_lock.writer(self.settings.database)
        group = procs.group_of(holder) if holder is not None and procs.stopped(holder) else None
        for child in self.children:
            if child.proc is None or group != child.proc.pid:
                child.stopped_holding_since = None
            elif child.stopped_holding_since is None:
                child.stopped_holding_since = now
            elif now - child.stopped_holding_since > self.settings.heartbeat_ttl:
                log.error("%s (pid %s) has been stopped for over %.0f s while holding the database's "
                          "write lock, which every other process of the stack waits for: killing it",
                          child.spec.name, holder, self.settings.heartbeat_ttl)
                os.killpg(group, signal.SIGKILL)  # a stopped process dies of SIGKILL at once
                child.stopped_holding_since = None

    def _watch_broker(self, now: float) -> None:
        """Restart the embedded Redis when it is no longer running (with backoff if it fails)."""
        if self.redis is None or now < self.redis_retry_at or self.redis.alive():
            return
        gone = self.redis.recorded()
        log.warning("the embedded Redis (%s) is not running; restarting it",
                    gone.describe() if gone else self.redis.socket)
        try:
            self.redis.start()
        except Exception:  # a full disk, a broken binary: keep supervising, retry later
            self.redis_failures += 1
            delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** (self.redis_failures - 1))
            self.redis_retry_at = now + delay
            log.exception("could not restart the embedded Redis; retrying in %.1fs", delay)
            return
        self.redis_failures = 0
        found = self.redis.recorded()
        log.warning("restarted the embedded Redis (%s)", found.describe() if found else "no pid")

    def _request_stop(self, signum: int, _frame: object) -> None:
        log.info("received %s: stopping workers", signal.Signals(signum).name)
        self.stopping = True

    def _stop_all(self) -> None:
        live = [(c.spec.name, c.proc) for c in self.children
                if c.proc is not None and c.proc.poll() is None]
        for _, proc in live:
            proc.terminate()  # Celery warm shutdown: finish the current job, then exit
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for name, proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs; killing it", name, STOP_GRACE_SECONDS)
                proc.kill()
                proc.wait()
            strays = groups.end(proc.pid, grace=1.0)  # a pool or beat process that outlived it
            if strays:
                log.warning("%s left %d processes behind; ended them", name, strays)
        for c in self.children:
            self._recover(c)

    def _recover(self, child: Child) -> list[int]:
        """A device worker that stopped: mark it dead and requeue the jobs it held."""
        if child.spec.device is None:
            return []
        try:
            beats.mark_dead(self.settings.database, child.spec.name)
            return recover_worker(self.settings, child.spec.name)
        except Exception:  # broker or database down: the supervisor must outlive it
            log.exception("could not requeue the jobs of %s now; Redis redelivers them after "
                          "its visibility timeout", child.spec.name)
            return []
