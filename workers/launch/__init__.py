"""Starting and stopping processes: the worker launcher, its process groups, process identity, `mxq
up`/`mxq down`, and who holds a port.

Imports (of mxq): core, db, workers.repair, workers.schedules, workers.jobs, workers.fleet,
workers.broker, workers.hardware, workers.storage, workers.settings, workers.stack_record,
workers.paths.
"""
