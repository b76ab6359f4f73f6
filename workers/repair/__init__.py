"""Putting things right after a fault: the reconciler, and the jobs of a worker that died.

Imports (of mxq): core, db, workers.schedules, workers.jobs, workers.fleet, workers.broker,
workers.hardware, workers.storage, workers.settings, workers.stack_record, workers.paths.
"""
