"""job logs: `job_logs`, what a job printed (its training child's stdout and stderr, its
worker's log records while it ran, mxq's notes), a row per line numbered per job, bounded per job
by MXQ_JOB_LOG_BYTES (its first and latest lines, a note where lines were dropped).

Revision ID: 0027
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_logs",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(8), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_logs")
