"""precision variants: a model version's int8 build and its agreement with float32

Revision ID: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("variants", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("variants")
