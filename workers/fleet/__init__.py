"""The live fleet: each device worker's heartbeat, the device table built from them, and the device
leases of multi-device jobs.

Imports (of mxq): core, db, workers.broker, workers.hardware, workers.storage, workers.settings,
workers.stack_record, workers.paths.
"""
