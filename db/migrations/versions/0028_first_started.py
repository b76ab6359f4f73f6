"""time limits: `first_started_at` on `jobs`, the first attempt's start, which the claims after it
keep (`started_at` is the last attempt's); a job's --time-limit counts from it, across attempts.
A job that started before this revision counts from its last attempt's start.

Revision ID: 0028
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("first_started_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE jobs SET first_started_at = started_at")


def downgrade() -> None:
    op.drop_column("jobs", "first_started_at")
