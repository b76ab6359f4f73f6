"""A version in MXNet's export format: its files checked and opened (`files.py`), its batch
proved by shape inference (`batch_proof.py`), and a version added from MXNet (`versions.py`:
built-in, exported, trained).

Imports (of mxq): core, db, workers, tasks.model_store, tasks.runtimes.
"""
