"""The dispatch case: mxq's submit-to-start path against a bare Celery app on the same broker
(`python -m bench --only dispatch`): the case (case.py) and its no-op Celery app (noop_app.py)."""
