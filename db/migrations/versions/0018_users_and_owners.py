"""users, roles and who owns what

- `users`: name, role (read, submit, admin), the clear id and the scrypt hash of its one token.
  The row `admin` is made here without a token: MXQ_API_TOKEN, when set, is its token, so a
  setup with the single API token keeps working, now as that user.
- `owner` on `jobs` (indexed with the submit time, for `mxq jobs --user`), `schedules` and
  `schedule_fires`. Rows from before this revision have none.

Revision ID: 0018
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    users = op.create_table(
        "users",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_id", sa.String(12), nullable=True, unique=True),
        sa.Column("token_hash", sa.String(160), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.bulk_insert(users, [{"name": "admin", "role": "admin", "token_id": None, "token_hash": None,
                              "created_at": datetime.now(UTC)}])
    for table in ("jobs", "schedules", "schedule_fires"):
        op.add_column(table, sa.Column("owner", sa.String(128), nullable=True))
    op.create_index("ix_jobs_owner_submitted", "jobs", ["owner", "submitted_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_submitted", "jobs")
    for table in ("schedule_fires", "schedules", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("owner")
    op.drop_table("users")
