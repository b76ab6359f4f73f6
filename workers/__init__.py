"""The worker layer, by concept: `hardware` (this host's devices), `fleet` (heartbeats, the device
table, leases), `broker` (the Celery app, transport, queues, routing, publishing), `launch` (the
launcher, process groups, `mxq up`/`down`), `schedules`, `jobs` (specs, submit, cancel) and `repair`
(the reconciler); `settings` and `paths` serve all of them.

Importing it, or any of its modules, starts nothing. `celery -A mxq.workers` loads
`mxq.workers.celery`, which connects the heartbeat to the worker's signals.

Imports (of mxq): core, db.
"""
