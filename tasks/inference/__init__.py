"""Bulk inference: the job, its input readers, batching, the read/compute/write pipeline, and where
predictions go.

Imports (of mxq): core, db, workers, tasks.model_store, tasks.runtimes, tasks.runner, tasks.job_context.
"""
