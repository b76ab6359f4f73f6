"""priorities and preemption

- `priority` (high, normal, low; rows from before are normal) and `preemptible` on `jobs`, and
  the same on `schedules` for their fires' jobs (`preemptible` None there: by the priority).
- `preemptions`, `preempt_for` and `preempted_by` on `jobs`: how often it yielded to a waiting
  job, the job it is asked to yield to now, and every job it yielded to.

Revision ID: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("jobs", "schedules"):
        op.add_column(table, sa.Column("priority", sa.String(8), nullable=False,
                                       server_default="normal"))
    op.add_column("jobs", sa.Column("preemptible", sa.Boolean, nullable=False,
                                    server_default=sa.false()))
    op.add_column("schedules", sa.Column("preemptible", sa.Boolean, nullable=True))
    op.add_column("jobs", sa.Column("preemptions", sa.Integer, nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("preempt_for", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("preempted_by", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("preemptible")
        batch.drop_column("priority")
    with op.batch_alter_table("jobs") as batch:
        for column in ("preempted_by", "preempt_for", "preemptions", "preemptible", "priority"):
            batch.drop_column(column)
