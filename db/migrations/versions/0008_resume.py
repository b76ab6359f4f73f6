"""resumable inference and stored preprocessing: a job's committed position, a version's
input scaling

Revision ID: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("committed", sa.Integer, nullable=True))
    op.add_column("models", sa.Column("preprocess", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("preprocess")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("committed")
