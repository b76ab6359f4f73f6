"""Object storage (S3 and S3-compatible servers): one client per process (`client`), reads of an
object by ranges with a bounded read-ahead (`ranged`), and where a user's location is checked:
a path confined to the data root, or an object confined to the allowed buckets (`locate`).

Imports (of mxq): core, db, workers.settings, workers.stack_record, workers.paths.
"""
