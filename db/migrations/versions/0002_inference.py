"""models, predictions, job metrics, chunked jobs

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("parent_id", sa.Integer, sa.ForeignKey("jobs.id", name="fk_jobs_parent")))
        batch.add_column(sa.Column("chunk_index", sa.Integer))
        batch.add_column(sa.Column("chunks", sa.Integer))
        batch.create_index("ix_jobs_parent", ["parent_id"])
    op.create_table(
        "models",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("arch", sa.String(64), nullable=False),
        sa.Column("input_shape", sa.JSON, nullable=False),
        sa.Column("classes", sa.Integer, nullable=False),
        sa.Column("params_file", sa.Text, nullable=False),
        sa.Column("symbol_file", sa.Text),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(256), nullable=False),
        sa.Column("promoted", sa.Boolean, nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.UniqueConstraint("name", "version", name="uq_models_name_version"),
    )
    op.create_table(
        "predictions",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("predicted_class", sa.Integer, nullable=False),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("top_k", sa.JSON),
    )
    op.create_table(
        "job_metrics",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("device", sa.String(32)),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("samples_per_sec", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_metrics")
    op.drop_table("predictions")
    op.drop_table("models")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_parent")
        batch.drop_column("chunks")
        batch.drop_column("chunk_index")
        batch.drop_column("parent_id")
