"""fair shares and quotas

- `share` (a weight, 1 for every user from before) and `max_devices` (at most this many devices
  at once; none: no quota) on `users`.
- `held` on `jobs`: a queued job not yet handed to the broker, published by the admitter when
  its owner's quota and share allow (false for every job from before); `borrowed` on `jobs`:
  admitted beyond its owner's quota onto an idle device (MXQ_QUOTA_BORROWING), taken back first.

Revision ID: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("share", sa.Float, nullable=False, server_default="1"))
    op.add_column("users", sa.Column("max_devices", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("held", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("borrowed", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_index("ix_jobs_held", "jobs", ["held", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_held", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("borrowed")
        batch.drop_column("held")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("max_devices")
        batch.drop_column("share")
