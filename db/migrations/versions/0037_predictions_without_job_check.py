"""predictions.job_id without its foreign key to jobs: each COPY'd row was checked against jobs
by PostgreSQL's referential trigger, which bounded an inference job's SQL rows (the MLP of bench
`sqlrows` stored 262,000 rows/s with it, 603,000 without). What it guarded holds without it: rows
are written only in a transaction that first updates their job's row under the attempt's fence
(`predictions.commit`, `batches.finish_batch`), and jobs are never deleted (retention deletes a
job's rows, not the job). On SQLite the table is rebuilt without the constraint (a copy of its
rows, once), and WITHOUT ROWID: its rows kept in their key's B-tree, one B-tree written per row
instead of a rowid table and the key's index.

Revision ID: 0037
"""

from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

# SQLite's constraint has no name: the rebuild names it by this convention to drop it.
NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("predictions_job_id_fkey", "predictions", type_="foreignkey")
        return
    with op.batch_alter_table("predictions", naming_convention=NAMING, recreate="always",
                              table_kwargs={"sqlite_with_rowid": False}) as batch:
        batch.drop_constraint("fk_predictions_job_id_jobs", type_="foreignkey")


def downgrade() -> None:
    with op.batch_alter_table("predictions") as batch:
        batch.create_foreign_key("predictions_job_id_fkey", "jobs", ["job_id"], ["id"])
