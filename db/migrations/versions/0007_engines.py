"""inference engines: a model version's ONNX export and each engine's measured speed

Revision ID: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("onnx", sa.JSON, nullable=True))
    op.add_column("models", sa.Column("engines", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("engines")
        batch.drop_column("onnx")
