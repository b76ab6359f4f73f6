"""Lineage as other tools read it: OpenLineage run events of mxq's jobs."""
