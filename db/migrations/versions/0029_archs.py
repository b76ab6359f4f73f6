"""your own architectures: `archs`, the code `mxq arch add` registered, a row per version of a
name (its file stored by content, `sha256`, in the model store; its `factory` builds the net;
the trial forward's `classes` and `input_shape`). A training of NAME pins the newest version's
checksum at submit.

Revision ID: 0029
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "archs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("factory", sa.String(128), nullable=False),
        sa.Column("file_name", sa.String(256), nullable=False),
        sa.Column("classes", sa.Integer, nullable=False),
        sa.Column("input_shape", sa.JSON, nullable=False),
        sa.Column("added_by", sa.String(128), nullable=True),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("name", "version", name="uq_archs_name_version"),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("archs")
