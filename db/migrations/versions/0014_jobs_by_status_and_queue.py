"""an index on (status, queue): the device table counts each queue's queued and running jobs, and
with 100,000 queued it sorted them all on every refresh

Revision ID: 0014
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_status_queue", "jobs", ["status", "queue"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_queue", table_name="jobs")
