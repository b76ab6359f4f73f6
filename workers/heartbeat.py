"""The heartbeat a device worker process writes: it is how routing knows the device is live.

Started on Celery's `worker_ready` (the worker consumes from then on) and cleared on shutdown.
A thread keeps beating while the solo pool's main thread runs a long job.
"""

from __future__ import annotations

import logging
import os
import threading

from celery import signals

from db import jobs, workers
from workers import leases
from workers.queues import device_queue, parse_device, pool_queue, worker_name
from workers.settings import get_settings

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, url: str, name: str, interval: float, lease_watch: LeaseWatch | None = None) -> None:
        self.url, self.name, self.interval = url, name, interval
        self.current_job: int | None = None
        self.lease_watch = lease_watch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mxq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat(self) -> None:
        job = self.current_job
        workers.beat(self.url, self.name, job)
        if job is not None:
            jobs.beat(self.url, job, self.name)
        if self.lease_watch is not None:
            self.lease_watch.check(job)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception:  # a database blip must not kill the heartbeat
                log.exception("heartbeat failed; retrying in %.1fs", self.interval)

    def stop(self) -> None:
        self._stop.set()
        workers.mark_dead(self.url, self.name)


class LeaseWatch:
    """While another job leases this worker's device, the worker stops consuming its queues.

    A message that slips through is handed back by the runner; consuming resumes as soon as the
    lease is released or expires (its holder died).
    """

    def __init__(self, broker: str, node: str, device: str, name: str, queues: list[str]) -> None:
        self.broker, self.node, self.device, self.name, self.queues = broker, node, device, name, queues
        self.paused = False

    def check(self, current_job: int | None) -> None:
        holder = leases.holders(self.broker, self.node, [self.device])[self.device]
        lent = holder is not None and holder != current_job
        if lent != self.paused:
            from workers.app import app

            for q in self.queues:
                if lent:
                    app.control.cancel_consumer(q, destination=[self.name])
                else:
                    app.control.add_consumer(q, destination=[self.name])
            self.paused = lent
            log.info("%s %s consuming: %s is %s", self.name, "stopped" if lent else "resumed",
                     self.device, f"leased by job {holder}" if lent else "free")


current: Heartbeat | None = None


@signals.worker_ready.connect
def _start(**_: object) -> None:
    global current
    s = get_settings()
    if s.device is None:  # a worker started by hand, not by the launcher: no device to announce
        return
    spec = parse_device(s.device)
    name = worker_name(s.node, spec.kind, spec.index)
    queues = [device_queue(s.node, spec.kind, spec.index), pool_queue(spec.kind)]
    workers.register(s.database, name, s.node, s.device, queues[0], os.getpid(), {})
    watch = LeaseWatch(s.broker, s.node, s.device, name, queues)
    current = Heartbeat(s.database, name, s.heartbeat_seconds, watch)
    current.start()
    log.info("%s is live on %s", name, s.device)


@signals.worker_shutdown.connect
def _stop(**_: object) -> None:
    if current is not None:
        current.stop()
