"""What produced what: the bytes each model version scored for an inference schedule, once
(`scored.py`).

Imports (of mxq): db.
"""
