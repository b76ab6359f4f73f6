"""Work that follows work: `mxq schedule` (retraining and inference on schedules), `mxq hooks`
(signed webhooks) and `mxq lineage` (what produced each prediction set).

Imports (of mxq): core, cli, db, workers.
"""
