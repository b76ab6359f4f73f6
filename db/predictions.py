"""Per-sample inference results, written in bulk and read back in pages."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import delete, func, select

from mxq.db.engine import get_engine, session_scope
from mxq.db.retry import db_retry
from mxq.db.schema import Prediction


@db_retry
def replace_range(url: str, job_id: int, start: int, stop: int) -> None:
    """Clear [start, stop) before a (re)run writes it: a redelivered chunk never duplicates rows."""
    with session_scope(url) as session:
        session.execute(delete(Prediction).where(Prediction.job_id == job_id, Prediction.idx >= start,
                                                 Prediction.idx < stop))


COLUMNS = ("job_id", "idx", "predicted_class", "score", "top_k")
Row = tuple[int, int, int, float, str | None]  # top_k as JSON text


@db_retry
def write(url: str, rows: list[Row]) -> None:
    """Store rows in one bulk write: COPY on PostgreSQL, a driver-level executemany elsewhere.

    Both skip per-value ORM processing, which on a busy worker costs more CPU than the model.
    """
    if not rows:
        return
    engine = get_engine(url)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            with cast(Any, conn.connection).cursor() as cur, cur.copy(
                    f"COPY predictions ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join([_MARK[engine.dialect.paramstyle]] * len(COLUMNS))
            # Column names and placeholders are constants; every value is a bound parameter.
            conn.exec_driver_sql(f"INSERT INTO predictions ({', '.join(COLUMNS)}) VALUES ({marks})",  # noqa: S608
                                 rows)


_MARK = {"qmark": "?", "format": "%s", "pyformat": "%s", "numeric": "?"}


def count(url: str, job_id: int) -> int:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).where(Prediction.job_id == job_id)) or 0


def read(url: str, job_id: int, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
    q = (select(Prediction.idx, Prediction.predicted_class, Prediction.score, Prediction.top_k)
         .where(Prediction.job_id == job_id).order_by(Prediction.idx).offset(offset))
    if limit is not None:
        q = q.limit(limit)
    with session_scope(url) as session:
        return [{"index": i, "predicted_class": c, "score": sc, "top_k": tk}
                for i, c, sc, tk in session.execute(q)]
