"""Putting things right after a fault: the reconciler, and the jobs of a worker that died.

Imports (of mxq): core, db, workers.schedules, workers.jobs, workers.fleet, workers.broker,
workers.settings.
"""
