"""private by default: teams, sharing, dashboard sessions, idempotency keys per owner

- `teams` and `team_members` (a user belongs to several teams);
- `team` on `jobs` and `schedules` (what they were shared with; none: the owner alone), `owner`
  and `team` on `models` (who may register and promote its versions; none: admins only, as every
  model from before);
- `removed_at` on `users`: a removed user stays as a row without a token, so its name is never
  given to another user and what it owned stays its own;
- `sessions`: the dashboard's logins (a SHA-256 of the cookie, never the cookie);
- the idempotency key is unique per owner, no longer across the stack.

Revision ID: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False))
    op.create_table(
        "team_members",
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("user", sa.String(64), sa.ForeignKey("users.name", ondelete="CASCADE"),
                  primary_key=True))
    op.create_index("ix_team_members_user", "team_members", ["user"])
    op.create_table(
        "sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(64), sa.ForeignKey("users.name", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False))
    op.add_column("users", sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("team", sa.String(64), nullable=True))
    op.add_column("schedules", sa.Column("team", sa.String(64), nullable=True))
    op.add_column("models", sa.Column("owner", sa.String(128), nullable=True))
    op.add_column("models", sa.Column("team", sa.String(64), nullable=True))
    op.drop_index("ux_jobs_idempotency_key", "jobs")
    op.create_index("ux_jobs_owner_idempotency_key", "jobs", ["owner", "idempotency_key"],
                    unique=True)


def downgrade() -> None:
    op.drop_index("ux_jobs_owner_idempotency_key", "jobs")
    op.create_index("ux_jobs_idempotency_key", "jobs", ["idempotency_key"], unique=True)
    with op.batch_alter_table("models") as batch:
        batch.drop_column("team")
        batch.drop_column("owner")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("team")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("team")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("removed_at")
    op.drop_table("sessions")
    op.drop_index("ix_team_members_user", "team_members")
    op.drop_table("team_members")
    op.drop_table("teams")
