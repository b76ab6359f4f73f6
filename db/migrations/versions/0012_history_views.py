"""history views for SQL and BI tools: job_history (one row per job, with its model, times,
queue wait, run time, throughput) and device_daily (jobs, samples and busy time per device and
day), on both backends

Revision ID: 0012
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# What differs by backend: reading a JSON field, seconds between two times, a time's day.
DIALECT = {
    "sqlite": {"json": "json_extract({col}, '$.{key}')",
               "seconds": "((julianday({b}) - julianday({a})) * 86400.0)",
               "now": "'now'", "day": "date({t})"},
    "postgresql": {"json": "({col}->>'{key}')",
                   "seconds": "EXTRACT(EPOCH FROM ({b} - {a}))",
                   "now": "now()", "day": "CAST(date_trunc('day', {t}) AS date)"},
}


def _job_history(d: dict[str, str]) -> str:
    def field(col: str, key: str) -> str:
        return d["json"].format(col=col, key=key)

    trained = f"CASE WHEN kind = 'train' THEN {field('params', 'name')} END"
    model = f"COALESCE({field('params', 'model')}, {trained})"
    version = f"COALESCE({field('result', 'model_version')}, {field('params', 'model_version')})"
    return f"""
CREATE VIEW job_history AS
SELECT id, kind, status, {model} AS model, CAST({version} AS INTEGER) AS model_version,
       device, node, worker, parent_id, submitted_at, started_at, finished_at,
       {d["seconds"].format(a="submitted_at", b="started_at")} AS queue_wait_seconds,
       {d["seconds"].format(a="started_at", b="finished_at")} AS run_seconds,
       {d["seconds"].format(a="finished_at", b=d["now"])} / 86400.0 AS age_days,
       samples, samples_per_sec, attempts, error
FROM jobs"""


def _device_daily(d: dict[str, str]) -> str:
    return f"""
CREATE VIEW device_daily AS
SELECT device, node, {d["day"].format(t="started_at")} AS day,
       COUNT(*) AS jobs,
       SUM(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END) AS succeeded,
       SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed,
       COALESCE(SUM(samples), 0) AS samples,
       COALESCE(SUM(run_seconds), 0) AS busy_seconds
FROM job_history
WHERE device IS NOT NULL AND started_at IS NOT NULL
GROUP BY device, node, {d["day"].format(t="started_at")}"""


def upgrade() -> None:
    d = DIALECT[op.get_bind().dialect.name]
    op.execute(_job_history(d))
    op.execute(_device_daily(d))


def downgrade() -> None:
    op.execute("DROP VIEW device_daily")
    op.execute("DROP VIEW job_history")
