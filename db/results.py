"""A job's predictions wherever its output kind stored them: SQL rows, or its Parquet file
(`--output parquet` keeps no rows in SQL). The CLI and the API read them through here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from mxq.db import parquet, predictions
from mxq.db.records import JobRecord

PAGE_ROWS = 50_000  # rows read at a time by an export


def output_file(home: Path, job_id: int, suffix: str) -> Path:
    """Where a job's file output lives: `$MXQ_HOME/outputs/job-ID.npy` or `.parquet`."""
    return home / "outputs" / f"job-{job_id}{suffix}"


def _parquet_of(home: Path, record: JobRecord) -> Path | None:
    """The job's merged Parquet file, when it asked for one and it is there."""
    if (record.get("params") or {}).get("output") != "parquet":
        return None
    path = output_file(home, record["id"], ".parquet")
    return path if path.exists() else None


def read(url: str, home: Path, record: JobRecord, limit: int | None = None,
         offset: int = 0) -> list[dict[str, Any]]:
    """Rows `offset` onwards, at most `limit`, ordered by index."""
    path = _parquet_of(home, record)
    if path is not None:
        return list(parquet.read_rows(path, limit, offset))
    return predictions.read(url, record["id"], limit, offset)


def count(url: str, home: Path, record: JobRecord) -> int:
    path = _parquet_of(home, record)
    if path is not None:
        return int(pq.ParquetFile(path).metadata.num_rows)
    return predictions.count(url, record["id"])


def _sql_pages(url: str, record: JobRecord, limit: int | None,
               offset: int) -> Iterator[list[dict[str, Any]]]:
    """The job's SQL rows from `offset` (at most `limit`), a page of PAGE_ROWS at a time."""
    while limit is None or limit > 0:
        size = PAGE_ROWS if limit is None else min(PAGE_ROWS, limit)
        page = predictions.read(url, record["id"], size, offset)
        if not page:
            return
        yield page
        offset += len(page)
        limit = None if limit is None else limit - len(page)


def export_parquet(url: str, home: Path, record: JobRecord, out: Path, limit: int | None = None,
                   offset: int = 0) -> int:
    """Write the job's stored predictions to `out` as Parquet; the number of rows written."""
    top_k = int((record.get("params") or {}).get("top_k") or 0)
    path = _parquet_of(home, record)
    tables = (parquet.read_tables(path, limit, offset) if path is not None else
              (parquet.from_rows(page, top_k) for page in _sql_pages(url, record, limit, offset)))
    tmp = out.with_name(out.name + ".tmp")
    rows = parquet.write_tables(tables, tmp, parquet.schema(top_k))
    tmp.replace(out)
    return rows


def prediction_csv(rows: list[dict[str, Any]]) -> Iterator[list[Any]]:
    """The predictions' CSV, the same from the CLI and the API: `index,predicted_class,score`,
    then `top_1,top_score_1,…` when top-k was stored; the header first."""
    k = max((len(r["top_k"] or []) for r in rows), default=0)
    yield ["index", "predicted_class", "score",
           *[f"{h}_{i}" for i in range(1, k + 1) for h in ("top", "top_score")]]
    for r in rows:
        pairs = [v for pair in (r["top_k"] or []) for v in pair]
        yield [r["index"], r["predicted_class"], f"{r['score']:.6g}", *pairs]
