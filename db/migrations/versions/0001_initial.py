"""jobs and worker heartbeats

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("requested_device", sa.String(64), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("node", sa.String(64)),
        sa.Column("device", sa.String(32)),
        sa.Column("worker", sa.String(128)),
        sa.Column("submitted_at", TS, nullable=False),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        sa.Column("heartbeat_at", TS),
        sa.Column("progress", sa.Float, nullable=False),
        sa.Column("samples", sa.Integer),
        sa.Column("seconds", sa.Float),
        sa.Column("samples_per_sec", sa.Float),
        sa.Column("result", sa.JSON),
        sa.Column("error", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name="ck_jobs_status",
        ),
    )
    for name, cols in {
        "ix_jobs_status_submitted": ["status", "submitted_at"],
        "ix_jobs_kind_submitted": ["kind", "submitted_at"],
        "ix_jobs_device_submitted": ["device", "submitted_at"],
        "ix_jobs_node_submitted": ["node", "submitted_at"],
        "ix_jobs_submitted": ["submitted_at"],
        "ix_jobs_worker_status": ["worker", "status"],
    }.items():
        op.create_index(name, "jobs", cols)
    op.create_table(
        "workers",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("node", sa.String(64), nullable=False),
        sa.Column("device", sa.String(32), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("pid", sa.Integer),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("last_seen", TS),
        sa.Column("current_job", sa.Integer),
        sa.Column("info", sa.JSON, nullable=False),
    )
    op.create_index("ix_workers_node_device", "workers", ["node", "device"])


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_table("jobs")
