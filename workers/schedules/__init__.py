"""Scheduled retraining and inference: cron times and intervals, the schedule process's fires
and control tasks, where a schedule's dataset comes from, and an inference schedule's fire
(`scoring.py`: each new file scored once by the version it follows).

Imports (of mxq): core, db, workers.jobs, workers.fleet, workers.broker, workers.hardware,
workers.storage, workers.settings, workers.stack_record, workers.paths.
"""
