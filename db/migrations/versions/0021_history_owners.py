"""job_history shows who submitted each job and at which priority: `owner`, `priority` and
`preemptions` after its other columns (device_daily, which reads it, is made again unchanged)

Revision ID: 0021
"""

import importlib

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# The views as 0012 made them, by that revision's own code, so the two never drift apart.
_views = importlib.import_module("mxq.db.migrations.versions.0012_history_views")
LAST_COLUMNS = "samples, samples_per_sec, attempts, error\nFROM jobs"


def _drop() -> None:
    op.execute("DROP VIEW device_daily")
    op.execute("DROP VIEW job_history")


def upgrade() -> None:
    d = _views.DIALECT[op.get_bind().dialect.name]
    history = _views._job_history(d)
    assert LAST_COLUMNS in history  # 0012's view, as this revision extends it
    _drop()
    op.execute(history.replace(LAST_COLUMNS, "samples, samples_per_sec, attempts, error, owner, "
                                             "priority, preemptions\nFROM jobs"))
    op.execute(_views._device_daily(d))


def downgrade() -> None:
    _drop()
    _views.upgrade()
