"""What produced what: each prediction set's lineage read from the `prediction_lineage` view
(`lineage.py`), and which jobs' OpenLineage events are due (`openlineage.py`). The bytes each
model version scored for an inference schedule are the schedules' claims (`db/schedules/claims.py`).

Imports (of mxq): core, db.
"""
