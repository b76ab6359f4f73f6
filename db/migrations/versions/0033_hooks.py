"""signed webhooks: `hooks` (an endpoint: its URL, the events it wants, the secret its
deliveries are signed with, who added it) and `hook_deliveries` (the outbox: one row per event
per endpoint, written in the transaction of the change it reports, sent by the schedule
process, retried with backoff until `expires_at`, its status, attempts and last answer kept).

Revision ID: 0033
"""

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hooks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.JSON, nullable=False),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "hook_deliveries",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("hook_id", sa.Integer, sa.ForeignKey("hooks.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_code", sa.Integer, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_hook_deliveries_due", "hook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_hook_deliveries_hook", "hook_deliveries", ["hook_id", "created_at"])


def downgrade() -> None:
    op.drop_table("hook_deliveries")
    op.drop_table("hooks")
