"""predictions as blocks: a row per run of a job's consecutive samples (job_id, first_index,
samples, classes and scores as packed little-endian int32 and float32 arrays, top_k as a JSON list
a sample), not a row a sample. The (job, index) key's B-tree insert per sample was two thirds of
PostgreSQL's cost of storing a prediction, and bounded an `--output db` job under half its `.npy`
rate (mxq.db.outputs.blocks). Existing rows are kept: each job's runs of consecutive indexes
become blocks of at most BLOCK samples. On SQLite the table has rowids again (0037 made it
WITHOUT ROWID, which suits small rows, not blocks of kilobytes).

Revision ID: 0038
"""

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None

BLOCK = 4096
BLOCK_COLUMNS = ("job_id", "first_index", "samples", "classes", "scores", "top_k")
ROW_COLUMNS = ("job_id", "idx", "predicted_class", "score", "top_k")


def upgrade() -> None:
    op.create_table(
        "prediction_blocks",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("first_index", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("classes", sa.LargeBinary, nullable=False),
        sa.Column("scores", sa.LargeBinary, nullable=False),
        sa.Column("top_k", sa.Text),
    )
    conn = op.get_bind()
    blocks = sa.table("prediction_blocks", *(sa.column(c) for c in BLOCK_COLUMNS))
    jobs = conn.execute(sa.text("SELECT DISTINCT job_id FROM predictions ORDER BY job_id")).scalars().all()
    for job in jobs:
        rows = conn.execute(sa.text("SELECT idx, predicted_class, score, top_k FROM predictions "
                                    "WHERE job_id = :job ORDER BY idx"), {"job": job}).all()
        values = [_block(job, run) for run in _runs(rows)]
        if values:
            conn.execute(sa.insert(blocks), values)
    op.drop_table("predictions")
    op.rename_table("prediction_blocks", "predictions")
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE predictions RENAME CONSTRAINT prediction_blocks_pkey TO predictions_pkey")


def _runs(rows: Sequence[Any]) -> Iterator[Sequence[Any]]:
    """`rows` (ordered by index) cut where an index is not the one before plus one, and every BLOCK."""
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][0] != rows[i - 1][0] + 1 or i - start == BLOCK:
            yield rows[start:i]
            start = i


def _block(job: int, run: Sequence[Any]) -> dict[str, Any]:
    tops = [r[3] if r[3] is None or isinstance(r[3], str) else json.dumps(r[3]) for r in run]
    top = None if all(t is None for t in tops) else f"[{','.join('null' if t is None else t for t in tops)}]"
    return {"job_id": job, "first_index": run[0][0], "samples": len(run),
            "classes": np.array([r[1] for r in run], "<i4").tobytes(),
            "scores": np.array([r[2] for r in run], "<f4").tobytes(), "top_k": top}


def downgrade() -> None:
    op.rename_table("predictions", "prediction_blocks")
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE prediction_blocks RENAME CONSTRAINT predictions_pkey "
                   "TO prediction_blocks_pkey")
    op.create_table(
        "predictions",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("predicted_class", sa.Integer, nullable=False),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("top_k", sa.JSON),
        sqlite_with_rowid=False,
    )
    rows = sa.table("predictions", *(sa.column(c) for c in ROW_COLUMNS))
    for job, first, classes, scores, top in conn.execute(sa.text(
            "SELECT job_id, first_index, classes, scores, top_k FROM prediction_blocks "
            "ORDER BY job_id, first_index")).all():
        tops = [None] * (len(classes) // 4) if top is None else [
            None if t is None else json.dumps(t) for t in json.loads(top)]
        conn.execute(sa.insert(rows), [
            {"job_id": job, "idx": first + i, "predicted_class": c, "score": s, "top_k": t}
            for i, (c, s, t) in enumerate(zip(np.frombuffer(classes, "<i4").tolist(),
                                              np.frombuffer(scores, "<f4").tolist(), tops, strict=True))])
    op.drop_table("prediction_blocks")
