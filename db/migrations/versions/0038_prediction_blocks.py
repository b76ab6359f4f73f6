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
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None

BLOCK = 4096


def upgrade() -> None:
    blocks = op.create_table(
        "prediction_blocks",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("first_index", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("classes", sa.LargeBinary, nullable=False),
        sa.Column("scores", sa.LargeBinary, nullable=False),
        sa.Column("top_k", sa.Text),
    )
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT job_id, idx, predicted_class, score, top_k FROM predictions "
                                "ORDER BY job_id, idx").execution_options(yield_per=16 * BLOCK))
    values: list[dict[str, Any]] = []
    for run in _runs(rows):
        values.append(_block(run))
        if len(values) == 16:
            conn.execute(sa.insert(blocks), values)
            values = []
    if values:
        conn.execute(sa.insert(blocks), values)
    op.drop_table("predictions")
    op.rename_table("prediction_blocks", "predictions")
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE predictions RENAME CONSTRAINT prediction_blocks_pkey TO predictions_pkey")


def _runs(rows: Iterable[Any]) -> Iterator[list[Any]]:
    """`rows` (ordered by job and index), read as they come, cut where the job changes, where an
    index is not the one before plus one, and every BLOCK."""
    run: list[Any] = []
    for r in rows:
        if run and (r[0] != run[-1][0] or r[1] != run[-1][1] + 1 or len(run) == BLOCK):
            yield run
            run = []
        run.append(r)
    if run:
        yield run


def _block(run: list[Any]) -> dict[str, Any]:
    tops = [r[4] if r[4] is None or isinstance(r[4], str) else json.dumps(r[4]) for r in run]
    top = None if all(t is None for t in tops) else f"[{','.join('null' if t is None else t for t in tops)}]"
    return {"job_id": run[0][0], "first_index": run[0][1], "samples": len(run),
            "classes": np.array([r[2] for r in run], "<i4").tobytes(),
            "scores": np.array([r[3] for r in run], "<f4").tobytes(), "top_k": top}


def downgrade() -> None:
    op.rename_table("predictions", "prediction_blocks")
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE prediction_blocks RENAME CONSTRAINT predictions_pkey "
                   "TO prediction_blocks_pkey")
    rows = op.create_table(
        "predictions",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("predicted_class", sa.Integer, nullable=False),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("top_k", sa.JSON),
        sqlite_with_rowid=False,
    )
    for job, first, classes, scores, top in conn.execute(sa.text(
            "SELECT job_id, first_index, classes, scores, top_k FROM prediction_blocks "
            "ORDER BY job_id, first_index")).all():
        tops = [None] * (len(classes) // 4) if top is None else json.loads(top)
        conn.execute(sa.insert(rows), [
            {"job_id": job, "idx": first + i, "predicted_class": c, "score": s, "top_k": t}
            for i, (c, s, t) in enumerate(zip(np.frombuffer(classes, "<i4").tolist(),
                                              np.frombuffer(scores, "<f4").tolist(), tops, strict=True))])
    op.drop_table("prediction_blocks")
