"""schedules and their fires

Revision ID: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("tz", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("dataset", sa.Text, nullable=False),
        sa.Column("promote", sa.String(16), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("min_gain", sa.Float, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("next_fire_at", TS, nullable=False),
        sa.Column("last_fire_at", TS),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_schedules_due", "schedules", ["enabled", "next_fire_at"])
    op.create_table(
        "schedule_fires",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.Integer, sa.ForeignKey("schedules.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("fire_time", TS, nullable=False),
        sa.Column("fired_at", TS, nullable=False),
        sa.Column("manual", sa.Boolean, nullable=False),
        sa.Column("missed", sa.Integer, nullable=False),
        sa.Column("dataset_file", sa.Text),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id")),
        sa.Column("error", sa.Text),
        sa.Column("promotion", sa.JSON),
        sa.UniqueConstraint("schedule_id", "fire_time", name="uq_fires_schedule_time"),
    )


def downgrade() -> None:
    op.drop_table("schedule_fires")
    op.drop_index("ix_schedules_due", "schedules")
    op.drop_table("schedules")
