"""inference schedules: a schedule that scores each new file of an input once

- `schedules.kind`: `train` (every schedule before this revision) or `infer` (its `spec` holds an
  inference request less its input; `dataset` is the input glob or `s3://` prefix).
- `schedules.rescore`: an inference schedule that follows a model's promoted version fires as
  soon as another version is promoted, its jobs at this priority level; NULL: not on promotion.
- `schedules.followed_version`: the version its newest fire scored with (what a promotion is
  compared with).
- `schedule_fires.scored`: how many files an inference fire submitted (NULL while it submits:
  the reconciler finishes a fire left so); `schedule_fires.rescore_version`: set on a fire a
  promotion made (its jobs run at the schedule's `rescore` level).
- `scored_inputs`: one row per (model, version, input identity) an inference schedule submitted:
  the bytes a version scored, once (unique), with the job that scored them.

Revision ID: 0031
"""

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("kind", sa.String(8), nullable=False, server_default="train"))
        batch.add_column(sa.Column("rescore", sa.String(8), nullable=True))
        batch.add_column(sa.Column("followed_version", sa.Integer, nullable=True))
    with op.batch_alter_table("schedule_fires") as batch:
        batch.add_column(sa.Column("scored", sa.Integer, nullable=True))
        batch.add_column(sa.Column("rescore_version", sa.Integer, nullable=True))
    op.create_table(
        "scored_inputs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("identity", sa.String(256), nullable=False),
        sa.Column("location", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("mtime_ns", sa.BigInteger, nullable=True),
        sa.Column("schedule_id", sa.Integer, sa.ForeignKey("schedules.id", ondelete="SET NULL"),
                  nullable=True),
        sa.Column("fire_id", sa.Integer, sa.ForeignKey("schedule_fires.id"), nullable=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("model", "version", "identity", name="uq_scored_inputs_identity"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_scored_inputs_location", "scored_inputs", ["model", "version", "location"])


def downgrade() -> None:
    op.drop_index("ix_scored_inputs_location", table_name="scored_inputs")
    op.drop_table("scored_inputs")
    with op.batch_alter_table("schedule_fires") as batch:
        batch.drop_column("rescore_version")
        batch.drop_column("scored")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("followed_version")
        batch.drop_column("rescore")
        batch.drop_column("kind")
