"""What `celery -A mxq.workers` loads: the process-wide app, with the heartbeat on the signals.

Celery looks for a `celery` module in a package that has no `app`, so the package itself stays
free of side effects; only a worker process started through `-A` connects these handlers.
"""

from celery import signals

from mxq.workers.broker.app import app
from mxq.workers.fleet import heartbeat

signals.worker_init.connect(heartbeat.refuse_unclear, weak=False)
signals.worker_ready.connect(heartbeat.start, weak=False)
signals.worker_shutdown.connect(heartbeat.stop, weak=False)

__all__ = ["app"]
