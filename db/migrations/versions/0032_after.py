"""job dependencies (`--after`)

- `jobs.after`: the jobs a job waits for (`--after 12,15`, Slurm's afterok), as a JSON list of
  ids; NULL for a job that waits for none, as every job before this revision.
- `jobs.awaiting`: true while the job is held for them (it is also `held`, so nothing publishes
  it); the dependency pass (`mxq.workers.jobs.dependencies`) clears it once they all succeeded,
  or fails the job when one of them failed, was cancelled or was removed. False for every job
  before this revision.

Revision ID: 0032
"""

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("after", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("awaiting", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_index("ix_jobs_awaiting", "jobs", ["awaiting", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_awaiting", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("awaiting")
        batch.drop_column("after")
