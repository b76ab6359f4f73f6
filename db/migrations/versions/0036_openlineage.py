"""openlineage_runs and openlineage_cursor: what the OpenLineage export has sent of each job
(START, and its end) and where its scan of the jobs table starts (mxq.db.lineage.openlineage)

Revision ID: 0036
"""

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "openlineage_runs",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("started_sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
    )
    op.create_table(
        "openlineage_cursor",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("low_job_id", sa.Integer, nullable=False),
        sa.Column("enabled_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("openlineage_cursor")
    op.drop_table("openlineage_runs")
