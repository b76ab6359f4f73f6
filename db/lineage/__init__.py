"""What produced what: the bytes each model version scored for an inference schedule, once
(`scored.py`), and each prediction set's lineage read from the `prediction_lineage` view
(`lineage.py`).

Imports (of mxq): core, db.
"""
