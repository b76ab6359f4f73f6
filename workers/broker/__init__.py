"""The broker side: the Celery app and its Redis transport, job messages and dead letters, the queues
and routing onto them, publishing, the embedded broker and its health.

Imports (of mxq): core, db, workers.hardware, workers.storage, workers.settings,
workers.stack_record, workers.paths.
"""
