"""scored inputs per schedule: a claim on an input's bytes is unique per (schedule, model,
version, identity), no longer per (model, version, identity) whoever owns the schedule, so one
user's schedule never blocks, delays or reveals another's (issue 58). The location index leads
with the schedule too. `prediction_lineage` reads the table, so it is dropped and made again
around the rebuild SQLite needs to change a constraint, with one column more:
`output_removed_at`, when the retention policy (`mxq gc`) removed the output it names.

Revision ID: 0035
"""

import importlib

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

_lineage = importlib.import_module("mxq.db.migrations.versions.0034_prediction_lineage")
_views = importlib.import_module("mxq.db.migrations.versions.0012_history_views")
_LAST = "j.submitted_at, j.finished_at\n"  # 0034's view's last columns


def _view_0035() -> None:
    sql = _lineage._lineage(_views.DIALECT[op.get_bind().dialect.name])
    assert sql.count(_LAST) == 1
    op.execute(sql.replace(_LAST, "j.submitted_at, j.finished_at, j.output_removed_at\n"))


def _key(old: str, new: str, columns: list[str], location: list[str]) -> None:
    op.execute("DROP VIEW prediction_lineage")
    op.drop_index("ix_scored_inputs_location", table_name="scored_inputs")
    with op.batch_alter_table("scored_inputs") as batch:
        batch.drop_constraint(old, type_="unique")
        batch.create_unique_constraint(new, columns)
    op.create_index("ix_scored_inputs_location", "scored_inputs", location)


def upgrade() -> None:
    _key("uq_scored_inputs_identity", "uq_scored_inputs_schedule_identity",
         ["schedule_id", "model", "version", "identity"], ["schedule_id", "model", "version", "location"])
    _view_0035()


def downgrade() -> None:
    # Two schedules' claims on the same bytes cannot both stay under the old key: the later go.
    op.execute("DELETE FROM scored_inputs WHERE id NOT IN (SELECT MIN(id) FROM scored_inputs "
               "GROUP BY model, version, identity)")
    _key("uq_scored_inputs_schedule_identity", "uq_scored_inputs_identity",
         ["model", "version", "identity"], ["model", "version", "location"])
    _lineage.upgrade()
