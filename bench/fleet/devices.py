"""Simulated device workers for the fleet benchmark: many devices in one process, each one through
mxq's real worker code except the computation.

    python -m bench.fleet.devices --devices sim000:0-7,sim001:0-1 --log FILE [--scale 1.0] [--recover]

Each device is a thread that does what a device worker does: registers its worker row and beats
with mxq's `Heartbeat` (its own thread), consumes its device queue and the `pool.gpu` queues (the
engine pools too) through the Celery app's own kombu connection (mxq's transport, prefetch 1,
ack after the job), and runs every delivery through `tasks.runner.run_job`: the read, the lease
check, the SQL claim, the outcome. A training leases its devices in Redis, waits for them to be
idle and renews the leases.
Only the body is simulated: it sleeps for a time drawn from the job's id (`work_seconds`), checking
for a cancel, writing progress and throughput points as a real body does.

With `--recover` it first requeues what its devices were running (what the launcher does when a
machine comes back). SIGTERM stops it after the running jobs; SIGKILL is the fault being simulated.
The log gets one JSON line per claimed delivery (`start`, with the claim time), per finished body
(`done`), per delivery handled (`ran`, with what became of it) and, every few seconds, the
process's counters (`stat`).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import math
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kombu import Exchange, Queue

from mxq.db import engine, fleet, jobs
from mxq.db.fleet import list_workers
from mxq.db.jobs import Placement
from mxq.shares import devices_needed
from mxq.tasks.job_context import JobContext, Outcome
from mxq.tasks.runner import Worker, run_job
from mxq.workers.broker.app import app_for
from mxq.workers.broker.queues import device_queue, pool_queues, worker_name
from mxq.workers.fleet import heartbeat, leases
from mxq.workers.repair.recovery import recover_worker
from mxq.workers.settings import Settings, get_settings

log = logging.getLogger("fleet-devices")

KIND = "gpu"  # the simulated devices are GPUs: they serve the gpu pool
SAMPLES_PER_SECOND = 1000.0  # what a simulated device "computes"
METRIC_SECONDS = 10.0  # a throughput point every this many seconds of work, as inference flushes do
STAT_SECONDS = 5.0
POOL_SIZE, POOL_OVERFLOW = 4, 2  # database connections of one process of simulated devices


def work_seconds(job_id: int, kind: str, scale: float) -> float:
    """How long the job's work takes: most inference jobs a few seconds, some tens of seconds,
    a few minutes; trainings tens of seconds on each of their devices."""
    rng = random.Random(job_id)
    if kind == "train":
        seconds = rng.uniform(20, 60)
    else:
        u = rng.random()
        seconds = (rng.lognormvariate(math.log(4.0), 0.5) if u < 0.90
                   else rng.uniform(15, 45) if u < 0.99 else rng.uniform(90, 240))
    return seconds * scale


class Log:
    """The process's JSON-lines log and counters (written from every device thread)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def write(self, **entry: Any) -> None:
        line = json.dumps({"t": time.time(), **entry})
        with self._lock:
            self._file.write(line + "\n")

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def stat(self) -> None:
        with self._lock:
            counts = dict(self.counts)
        self.write(e="stat", pid=os.getpid(), **counts)


class CountedHeartbeat(heartbeat.Heartbeat):
    """mxq's heartbeat, counting its writes (one worker row, and the job's row when it has one)."""

    def __init__(self, out: Log, *args: Any) -> None:
        super().__init__(*args)
        self.out = out

    def beat(self) -> None:
        self.out.count("worker_beats")
        if self.current_job is not None:
            self.out.count("job_beats")
        super().beat()


class SimDevice(threading.Thread):
    def __init__(self, settings: Settings, node: str, index: int, out: Log, scale: float,
                 stop: threading.Event) -> None:
        super().__init__(name=f"{KIND}{index}@{node}", daemon=True)
        self.s, self.out, self.scale, self.stop = settings, out, scale, stop
        self.node, self.device = node, f"{KIND}:{index}"
        self.name_ = worker_name(node, KIND, index)
        self.queue = device_queue(node, KIND, index)
        self.hb = CountedHeartbeat(out, settings.database, self.name_, settings.heartbeat_seconds,
                                   settings.cancel_grace_seconds)
        self.worker = Worker(Placement(self.name_, node, self.device), settings, self.hb)
        self._delivered = 0.0

    # -- the worker's life: register, beat, consume -------------------------------------------
    def run(self) -> None:
        fleet.register(self.s.database, self.name_, self.node, self.device, self.queue, os.getpid(),
                       {"simulated": True})
        self.hb.start()
        while not self.stop.is_set():
            try:
                self._consume()
            except Exception as exc:  # the broker went away: reconnect, as Celery's consumer does
                self.out.count("reconnects")
                log.info("%s: %s; reconnecting", self.name_, exc)
                self.stop.wait(0.5 + random.random())

    def _consume(self) -> None:
        names = [self.queue, *pool_queues(KIND)]
        queues = [Queue(n, Exchange(n), routing_key=n) for n in names]
        with app_for(self.s).connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            with conn.Consumer(queues, callbacks=[self._on_message], accept=["json"],
                               prefetch_count=1):
                while not self.stop.is_set():
                    try:
                        conn.drain_events(timeout=1)
                    except TimeoutError:
                        continue

    def _on_message(self, body: Any, message: Any) -> None:
        self._delivered = time.monotonic()
        task, job_id = str(message.headers.get("task")), int(body[0][0])
        try:
            train = task == "mxq.train"
            state = run_job(job_id, self._body, self._admit if train else None,
                            self._release if train else None, worker=self.worker)
            self.out.count(f"deliveries_{state}")
            self.out.write(e="ran", job=job_id, w=self.name_, state=state)
        except Exception as exc:  # a broker or database blip: Celery acks a failed task too
            self.out.count("delivery_errors")
            log.warning("%s: job %s: %s", self.name_, job_id, exc)
        try:
            message.ack()
        except Exception:  # the connection it came on is gone (a broker restart): start a new
            self.out.count("acks_lost")  # consumer, as Celery's does (this one's QoS still
            raise  # counts the message as delivered, so it would never take another)

    # -- the job: what is simulated -------------------------------------------------------------
    def _body(self, job: JobContext) -> Outcome:
        claim_ms = (time.monotonic() - self._delivered) * 1000
        self.out.count("claims")
        self.out.write(e="start", job=job.id, w=self.name_, claim_ms=claim_ms, kind=job.kind,
                       devices=len(job.devices))
        if len(job.devices) > 1:
            self._wait_idle(job)
        total = work_seconds(job.id, job.kind, self.scale)
        assert job.fence is not None  # set by the claim
        done, step, since_point, renewed = 0.0, jobs.next_metric_step(job.url, job.id), 0.0, 0.0
        while done < total:
            piece = min(0.5, total - done)
            time.sleep(piece)
            done += piece
            since_point += piece
            job.check_cancelled()
            job.progress(done / total)
            if len(job.devices) > 1 and done - renewed >= self.s.heartbeat_seconds:
                renewed = done
                self._renew(job)
            if since_point >= METRIC_SECONDS * self.scale or done >= total:
                for device in job.devices:  # a training records a point per device
                    jobs.record_metric(job.url, job.fence, step, device,
                                       int(since_point * SAMPLES_PER_SECOND), since_point)
                    self.out.count("metric_writes")
                    step += 1
                since_point = 0.0
        self.out.write(e="done", job=job.id, w=self.name_)
        samples = int(total * SAMPLES_PER_SECOND) * len(job.devices)
        return Outcome(samples=samples, seconds=total, result={"simulated": True})

    def _admit(self, job: JobContext) -> list[str] | None:
        """A training's devices: this one and the next free ones of its node, leased in order."""
        wanted = devices_needed(job.kind, job.stored)
        mine = sorted(w["device"] for w in list_workers(self.s.database, self.s.heartbeat_ttl, self.node)
                      if w["alive"])
        free = [d for d, holder in leases.holders(self.s.broker, self.node, mine).items()
                if holder in (None, job.id) and d != self.device]
        if len(free) + 1 < wanted:
            return None
        devices = [self.device, *free[:wanted - 1]]
        ttl = self.s.heartbeat_seconds * 5
        return devices if leases.acquire(self.s.broker, self.node, devices, job.id, ttl) else None

    def _release(self, job: JobContext) -> None:
        leases.release(self.s.broker, self.node, job.devices, job.id)

    def _renew(self, job: JobContext) -> None:
        try:
            leases.renew(self.s.broker, self.node, job.devices, job.id, self.s.heartbeat_seconds * 5)
        except Exception:  # the broker is restarting; the lease outlives a few missed renewals
            self.out.count("renewals_missed")

    def _wait_idle(self, job: JobContext) -> None:
        """The training's other devices finish what they run first (as tasks.train_task does)."""
        others = set(job.devices) - {self.device}
        while not self.stop.is_set():
            busy = [w for w in list_workers(self.s.database, self.s.heartbeat_ttl, self.node)
                    if w["device"] in others and w["alive"] and w["current_job"] not in (None, job.id)]
            if not busy:
                return
            self._renew(job)
            job.check_cancelled()
            time.sleep(self.s.heartbeat_seconds)


def parse_devices(text: str) -> list[tuple[str, int]]:
    """`sim000:0-7,sim001:0-1` -> [(sim000, 0), ..., (sim001, 1)]."""
    out = []
    for part in text.split(","):
        node, _, span = part.partition(":")
        first, _, last = span.partition("-")
        out += [(node, i) for i in range(int(first), int(last or first) + 1)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet.devices", description=__doc__.splitlines()[0])
    ap.add_argument("--devices", required=True, type=parse_devices)
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--scale", type=float, default=1.0, help="work times are multiplied by this")
    ap.add_argument("--recover", action="store_true", help="requeue what these devices were running")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack
    # This process's devices share a few connections (PostgreSQL's default max_connections is
    # 100); real workers hold one or two each (docs/scaling.md).
    engine.POOL_SIZE, engine.MAX_OVERFLOW = POOL_SIZE, POOL_OVERFLOW
    s, out, stop = get_settings(), Log(args.log), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    devices = [SimDevice(s, node, index, out, args.scale, stop) for node, index in args.devices]
    if args.recover:
        for d in devices:
            out.count("recovered", len(recover_worker(s, d.name_)))
    for d in devices:
        d.start()
    out.write(e="up", pid=os.getpid(), devices=len(devices))
    while not stop.wait(STAT_SECONDS):
        out.stat()
    for d in devices:
        d.join(timeout=300)
        d.hb.stop()
    out.stat()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
