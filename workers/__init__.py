"""The worker layer: settings, devices, queues and routing, the launcher, the reconciler.

Importing it, or any of its modules, starts nothing. `celery -A mxq.workers` loads
`mxq.workers.celery`, which connects the heartbeat to the worker's signals.
"""
