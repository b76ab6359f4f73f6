"""an index on when each throughput point was taken: the device table's samples/s (the last five
minutes of points) read every point ever recorded without it

Revision ID: 0013
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_job_metrics_at", "job_metrics", ["at"])


def downgrade() -> None:
    op.drop_index("ix_job_metrics_at", table_name="job_metrics")
