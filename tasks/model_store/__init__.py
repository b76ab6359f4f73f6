"""The model store: built-in architectures, imported and registered versions, and their checksums.

Imports (of mxq): core, db, workers, tasks.runtimes, tasks.runner, tasks.job_context.
"""
