"""what a model version outputs

- `models.outputs`: "logits" (mxq applies a softmax to get class probabilities) or
  "probabilities" (the model ends in a softmax; its output is used as it is). Every version
  registered before this revision was served as logits, so existing rows get "logits".

Revision ID: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("outputs", sa.String(16), nullable=False,
                                      server_default="logits"))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("outputs")
