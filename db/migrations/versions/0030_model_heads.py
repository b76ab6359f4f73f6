"""a model version's several outputs

- `models.heads`: for a version with several outputs (`mxq models add --outputs NAME=KIND,…`),
  each output in order as {"name", "kind", "width"}; its `outputs` is then "heads" and `classes`
  the widths' sum (a job computes one row of every output side by side). NULL for a version with
  one output, as every version before this revision.

Revision ID: 0030
"""

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("heads", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("heads")
