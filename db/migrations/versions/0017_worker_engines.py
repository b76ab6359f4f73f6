"""the engines each device worker has

- `workers.engines`: the inference engines the worker's device can run, comma-separated
  ("mxnet,onnx"; "onnx" for a GPU MXNet has no kernels for, an H200's). Routing sends a job
  that needs an engine only where it is (training and probes need MXNet). NULL for a row
  written before this revision: such a worker is taken to have both, as it was served before.

Revision ID: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("engines", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("engines")
