"""The live fleet: each device worker's heartbeat, the device table built from them, the device
leases of multi-device jobs, and the watchdog of a hung device (`hang_watch.py`).

Imports (of mxq): core, db, workers.broker, workers.hardware, workers.storage, workers.settings,
workers.stack_record, workers.paths.
"""
