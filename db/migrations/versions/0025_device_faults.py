"""device faults: `device_faults` on `jobs`, how often an attempt stopped because its device
failed (a CUDA error, ONNX Runtime without the device's provider) and the job went back to its
queue; like preemptions, they are not counted against MXQ_MAX_ATTEMPTS.

Revision ID: 0025
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("device_faults", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("jobs", "device_faults")
