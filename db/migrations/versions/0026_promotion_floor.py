"""promotion floor: `min_metric` on `schedules`, the least value of the policy's metric a
retrained version must reach to be promoted (None: no floor); below it the version is registered
and kept, whatever the policy, even when no version is promoted yet.

Revision ID: 0026
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("schedules", sa.Column("min_metric", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("schedules", "min_metric")
