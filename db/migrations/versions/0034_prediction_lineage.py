"""prediction_lineage: one row per inference job (a chunked job's parent, not its chunks) with
what produced its output: the model and version, the variant (its precision: fp32, int8, fp16)
and engine that served it, the input and its identity when submitted (and its bytes' checksum
or ETag when a schedule scored it), where the output went, mxq's version, and the schedule and
fire that made it, if one did

Revision ID: 0034
"""

import importlib

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

# Reading a JSON field, per backend, as 0012's history views do.
_views = importlib.import_module("mxq.db.migrations.versions.0012_history_views")


def _lineage(d: dict[str, str]) -> str:
    def field(col: str, key: str) -> str:
        return d["json"].format(col=f"j.{col}", key=key)

    return f"""
CREATE VIEW prediction_lineage AS
SELECT j.id AS job_id, j.status, j.owner, j.team,
       {field('params', 'model')} AS model,
       CAST({field('params', 'model_version')} AS INTEGER) AS model_version,
       {field('result', 'precision')} AS variant, {field('result', 'engine')} AS engine,
       {field('params', 'input')} AS input, {field('params', 'input_identity')} AS input_identity,
       s.identity AS input_bytes, {field('params', 'output')} AS output_format,
       COALESCE({field('result', 'output')}, {field('params', 'output_to')}) AS output,
       {field('result', 'mxq_version')} AS mxq_version,
       f.schedule_name AS schedule, s.fire_id, j.submitted_at, j.finished_at
FROM jobs j
LEFT JOIN scored_inputs s ON s.job_id = j.id
LEFT JOIN schedule_fires f ON f.id = s.fire_id
WHERE j.kind = 'infer' AND j.parent_id IS NULL"""


def upgrade() -> None:
    op.execute(_lineage(_views.DIALECT[op.get_bind().dialect.name]))


def downgrade() -> None:
    op.execute("DROP VIEW prediction_lineage")
