"""training epochs and the devices a job holds

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("devices", sa.JSON))
    op.create_table(
        "epochs",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("epoch", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("train_loss", sa.Float, nullable=False),
        sa.Column("train_accuracy", sa.Float, nullable=False),
        sa.Column("val_accuracy", sa.Float),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("samples_per_sec", sa.Float, nullable=False),
        sa.Column("per_device", sa.JSON, nullable=False),
        sa.Column("checkpoint", sa.Text),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("epochs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("devices")
