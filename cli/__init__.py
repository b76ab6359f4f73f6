"""The `mxq` command: a thin layer over the functions in `workers/` and `db/`. Never imports MXNet.

Imports (of mxq): core, client, db, workers, tasks.model_store, tasks.training (their in-process
commands, loaded on use).
"""
