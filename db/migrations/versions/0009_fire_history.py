"""fires outlive their schedule: each keeps its schedule's name and promotion policy, and removing
the schedule sets its `schedule_id` to NULL instead of deleting it

Revision ID: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def _fires(schedule_fk: sa.ForeignKey, nullable: bool) -> sa.Table:
    """schedule_fires as 0004 made it, with the schedule_id column given."""
    return sa.Table(
        "schedule_fires", sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.Integer, schedule_fk, nullable=nullable),
        sa.Column("fire_time", TS, nullable=False),
        sa.Column("fired_at", TS, nullable=False),
        sa.Column("manual", sa.Boolean, nullable=False),
        sa.Column("missed", sa.Integer, nullable=False),
        sa.Column("dataset_file", sa.Text),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id")),
        sa.Column("error", sa.Text),
        sa.Column("promotion", sa.JSON),
        sa.UniqueConstraint("schedule_id", "fire_time", name="uq_fires_schedule_time"),
    )


def _backfill() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT f.id, s.name, s.promote, s.metric, s.min_gain FROM "
                                "schedule_fires f JOIN schedules s ON s.id = f.schedule_id")).all()
    fires = sa.table("schedule_fires", sa.column("id", sa.Integer),
                     sa.column("schedule_name", sa.String), sa.column("policy", sa.JSON))
    for fire_id, name, promote, metric, min_gain in rows:
        bind.execute(fires.update().where(fires.c.id == fire_id).values(
            schedule_name=name, policy={"promote": promote, "metric": metric, "min_gain": min_gain}))


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":  # a foreign key changes only with the table
        # As the table is (its foreign key named here, so that the batch can drop it).
        old = _fires(sa.ForeignKey("schedules.id", ondelete="CASCADE", name="fk_fires_schedule"),
                     nullable=False)
        with op.batch_alter_table("schedule_fires", copy_from=old, recreate="always") as batch:
            batch.alter_column("schedule_id", existing_type=sa.Integer, nullable=True)
            batch.drop_constraint("fk_fires_schedule", type_="foreignkey")
            batch.create_foreign_key("fk_fires_schedule", "schedules", ["schedule_id"], ["id"],
                                     ondelete="SET NULL")
            batch.add_column(sa.Column("schedule_name", sa.String(128), nullable=True))
            batch.add_column(sa.Column("policy", sa.JSON, nullable=True))
    else:
        op.alter_column("schedule_fires", "schedule_id", existing_type=sa.Integer, nullable=True)
        op.drop_constraint("schedule_fires_schedule_id_fkey", "schedule_fires", type_="foreignkey")
        op.create_foreign_key("schedule_fires_schedule_id_fkey", "schedule_fires", "schedules",
                              ["schedule_id"], ["id"], ondelete="SET NULL")
        op.add_column("schedule_fires", sa.Column("schedule_name", sa.String(128), nullable=True))
        op.add_column("schedule_fires", sa.Column("policy", sa.JSON, nullable=True))
    _backfill()


def downgrade() -> None:
    op.execute("DELETE FROM schedule_fires WHERE schedule_id IS NULL")
    with op.batch_alter_table("schedule_fires") as batch:
        batch.drop_column("policy")
        batch.drop_column("schedule_name")
        batch.alter_column("schedule_id", existing_type=sa.Integer, nullable=False)
