"""Per-sample inference results, written in bulk and read back in pages."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, insert, select

from db.engine import session_scope
from db.schema import Prediction


def replace_range(url: str, job_id: int, start: int, stop: int) -> None:
    """Clear [start, stop) before a (re)run writes it: a redelivered chunk never duplicates rows."""
    with session_scope(url) as s:
        s.execute(delete(Prediction).where(Prediction.job_id == job_id, Prediction.idx >= start,
                                           Prediction.idx < stop))


def write(url: str, rows: list[dict[str, Any]]) -> None:
    """One bulk insert (executemany) per call."""
    if rows:
        with session_scope(url) as s:
            s.execute(insert(Prediction), rows)


def count(url: str, job_id: int) -> int:
    with session_scope(url) as s:
        return s.scalar(select(func.count()).where(Prediction.job_id == job_id)) or 0


def read(url: str, job_id: int, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
    q = (select(Prediction.idx, Prediction.predicted_class, Prediction.score, Prediction.top_k)
         .where(Prediction.job_id == job_id).order_by(Prediction.idx).offset(offset))
    if limit is not None:
        q = q.limit(limit)
    with session_scope(url) as s:
        return [{"index": i, "predicted_class": c, "score": sc, "top_k": tk}
                for i, c, sc, tk in s.execute(q)]
