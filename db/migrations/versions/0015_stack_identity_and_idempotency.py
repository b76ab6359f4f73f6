"""one identity per stack, and idempotent submits

- `stack`: one row holding this database's stack id (a random hex string made here). What a stack
  keeps on disk under `$MXQ_HOME` (outputs, Parquet parts, the model store, checkpoints) is keyed
  by it, so a home reused with another database never meets the old database's files.
- `jobs.idempotency_key`: a submit that carries a key (API header `Idempotency-Key`, the client's
  `idempotency_key=`) returns the job first made with it instead of making another.

Revision ID: 0015
"""

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    stack = op.create_table(
        "stack",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.current_timestamp()),
    )
    op.bulk_insert(stack, [{"id": secrets.token_hex(8)}])
    op.add_column("jobs", sa.Column("idempotency_key", sa.String(128), nullable=True))
    op.create_index("ux_jobs_idempotency_key", "jobs", ["idempotency_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_jobs_idempotency_key", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("idempotency_key")
    op.drop_table("stack")
