"""The heartbeat a device worker process writes: it is how routing knows the device is live.

Started on Celery's `worker_ready` (the worker consumes from then on) and cleared on shutdown;
`mxq.workers.celery` connects `start` and `stop` to those signals.
A thread keeps beating while the solo pool's main thread runs a long job.
"""

from __future__ import annotations

import logging
import os
import threading

from mxq.db import fleet, jobs
from mxq.device import Device
from mxq.workers.queues import device_queue, worker_name
from mxq.workers.settings import get_settings

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, url: str, name: str, interval: float) -> None:
        self.url, self.name, self.interval = url, name, interval
        self.current_job: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mxq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat(self) -> None:
        job = self.current_job
        fleet.beat(self.url, self.name, job)
        if job is not None:
            jobs.beat(self.url, job, self.name)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception:  # a database blip must not kill the heartbeat
                log.exception("heartbeat failed; retrying in %.1fs", self.interval)

    def stop(self) -> None:
        self._stop.set()
        fleet.mark_dead(self.url, self.name)


current: Heartbeat | None = None


def start(**_: object) -> None:
    """At `worker_ready`: register the device's worker row and start beating."""
    global current
    s = get_settings()
    if s.device is None:  # a worker started by hand, not by the launcher: no device to announce
        return
    spec = Device.parse(s.device)
    name = worker_name(s.node, spec.kind, spec.index)
    fleet.register(s.database, name, s.node, s.device, device_queue(s.node, spec.kind, spec.index),
                     os.getpid(), {})
    current = Heartbeat(s.database, name, s.heartbeat_seconds)
    current.start()
    log.info("%s is live on %s", name, s.device)


def stop(**_: object) -> None:
    """At `worker_shutdown`: stop beating and mark the worker dead."""
    if current is not None:
        current.stop()
