"""Training: the data-parallel job, its loop and child process, multi-node training, and the training
datasets.

Imports (of mxq): core, db, workers, tasks.middleware, tasks.inference, tasks.model_store, tasks.runtimes,
tasks.runner, tasks.job_context.
"""
