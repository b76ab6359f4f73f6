"""Scheduled retraining: cron times, the schedule process's fires and control tasks, and where a
schedule's dataset comes from.

Imports (of mxq): core, db, workers.jobs, workers.fleet, workers.broker, workers.hardware,
workers.storage, workers.settings, workers.stack_record, workers.paths.
"""
