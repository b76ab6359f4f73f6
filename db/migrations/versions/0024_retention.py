"""retention: outputs a user keeps, outputs and versions removed by the retention policy

- `pinned` on `jobs`: the owner keeps its output whatever MXQ_KEEP_OUTPUT_DAYS says;
- `output_removed_at` on `jobs`: when the retention policy removed its output (files and rows);
  the job's record stays, and its results say when and why they are gone;
- `removed_at` on `models`: when the policy removed an unpromoted version's files
  (MXQ_KEEP_VERSIONS); its row stays, so the history still names it.

Revision ID: 0024
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("output_removed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("models", sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_status_finished", "jobs", ["status", "finished_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_finished", "jobs")
    op.drop_column("models", "removed_at")
    op.drop_column("jobs", "output_removed_at")
    op.drop_column("jobs", "pinned")
