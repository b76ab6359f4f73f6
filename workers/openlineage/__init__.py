"""OpenLineage run events of every inference and training (`events`), sent from the schedule
process (`sender`) when OpenLineage is configured (`OPENLINEAGE_URL`, `openlineage.yml`).

Imports (of mxq): core, db, workers.settings.
"""
