"""ids are never reused on SQLite: the tables whose ids history refers to (jobs, job_events,
models, schedules, schedule_fires) are rebuilt with AUTOINCREMENT

Without it SQLite hands the id of a deleted last row to the next insert, so a job could name a
removed schedule's id as another, newer schedule's. PostgreSQL's sequences never go back; nothing
changes there.

Revision ID: 0010
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TABLES = ("jobs", "job_events", "models", "schedules", "schedule_fires")


def _rebuild(autoincrement: bool) -> None:
    """Copy each table into one made with (or without) AUTOINCREMENT. The copy keeps every id,
    and SQLite's sqlite_sequence starts at the largest. db.migrate runs this with foreign keys
    off (SQLite's own procedure for a table rebuild), so dropping the old jobs table deletes
    nothing that refers to it."""
    if op.get_bind().dialect.name != "sqlite":
        return
    for name in TABLES:
        with op.batch_alter_table(name, recreate="always",
                                  table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
