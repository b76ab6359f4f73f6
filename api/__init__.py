"""HTTP API and dashboard: FastAPI over the same functions the CLI calls.

Imports (of mxq): core, db, workers.
"""
