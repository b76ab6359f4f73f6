"""A job's way in: the parameters each kind accepts, submit, and cancel.

Imports (of mxq): core, db, workers.broker, workers.hardware, workers.storage, workers.settings,
workers.stack_record, workers.paths.
"""
