"""Predictions as Parquet: the part files a streaming job writes, their merge into one file,
and the export of a job's stored rows.

A job writing Parquet (`--output parquet`) stores each flush as one part file, named by the
range it holds, before it commits that position in SQL; a later attempt drops the parts past the
committed position and goes on. When every part of the job's samples is there (the last chunk of a
chunked job to finish sees it), the parts are merged, in order and one at a time, into
`job-ID.parquet`. Memory stays bounded by a part, never by the job.

Columns: `index` (int64), `predicted_class` (int32), `score` (float32), and with top-k
`top_k_classes` (list of int32) and `top_k_scores` (list of float32), best first.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from mxq.db.predictions import Ranked

ROW_GROUP_ROWS = 65_536  # rows per row group of a merged or exported file (about 1 MiB)
COMPRESSION = "zstd"
PART_COMPRESSION = "none"  # parts live until the merge: no compressor state in the worker
# Dictionary encoding only where values repeat: on the unique indexes and scores it would build
# a hash table per row group (tens of MiB a worker keeps) for no gain.
DICTIONARY_COLUMNS = ["predicted_class", "top_k_classes"]


def schema(top_k: int) -> pa.Schema:
    fields = [pa.field("index", pa.int64()), pa.field("predicted_class", pa.int32()),
              pa.field("score", pa.float32())]
    if top_k:
        fields += [pa.field("top_k_classes", pa.list_(pa.int32())),
                   pa.field("top_k_scores", pa.list_(pa.float32()))]
    return pa.schema(fields)


def _lists(values: NDArray[Any], kind: pa.DataType) -> pa.ListArray:
    """Rows of a 2-D array as a list column."""
    rows, width = values.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.ravel(), type=kind))


def from_probabilities(first: int, probs: NDArray[np.float32], top_k: int) -> pa.Table:
    """The rows of one batch of probabilities (sample `first` onwards)."""
    r = Ranked.of(probs, top_k)
    columns: list[Any] = [np.arange(first, first + len(probs), dtype=np.int64),
                          r.classes.astype(np.int32), r.scores.astype(np.float32)]
    if r.order is not None and r.best is not None:
        columns += [_lists(r.order.astype(np.int32), pa.int32()),
                    _lists(r.best.astype(np.float32), pa.float32())]
    return pa.Table.from_arrays(columns, schema=schema(top_k))


def from_rows(rows: list[dict[str, Any]], top_k: int) -> pa.Table:
    """Stored prediction rows (`mxq.db.predictions.read`) as a table."""
    columns: dict[str, list[Any]] = {"index": [r["index"] for r in rows],
                                     "predicted_class": [r["predicted_class"] for r in rows],
                                     "score": [r["score"] for r in rows]}
    if top_k:
        pairs = [json.loads(r["top_k"]) if isinstance(r["top_k"], str) else (r["top_k"] or [])
                 for r in rows]
        columns["top_k_classes"] = [[int(c) for c, _ in p] for p in pairs]
        columns["top_k_scores"] = [[float(v) for _, v in p] for p in pairs]
    return pa.Table.from_pydict(columns, schema=schema(top_k))


def parts_dir(final: Path) -> Path:
    return final.with_name(final.name + ".parts")


def _part_range(path: Path) -> tuple[int, int]:
    first, last = path.stem.split("-")
    return int(first), int(last)


def _parts(final: Path) -> list[tuple[int, int, Path]]:
    folder = parts_dir(final)
    if not folder.is_dir():
        return []
    return sorted((*_part_range(p), p) for p in folder.glob("*.parquet"))


def write_part(final: Path, tables: list[pa.Table]) -> None:
    """One flush of a streaming job as its part file, complete on disk before the job commits it."""
    table = pa.concat_tables(tables)
    if not table.num_rows:
        return
    index = table.column("index")
    first, last = index[0].as_py(), index[-1].as_py() + 1
    folder = parts_dir(final)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{first:012d}-{last:012d}.parquet"
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, compression=PART_COMPRESSION, use_dictionary=DICTIONARY_COLUMNS)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def drop_parts(final: Path, start: int, stop: int) -> None:
    """Remove the parts that begin in [start, stop): written by an attempt that died before it
    committed them (a new attempt writes them again)."""
    for first, _, path in _parts(final):
        if start <= first < stop:
            path.unlink(missing_ok=True)


def _complete(parts: list[tuple[int, int, Path]], count: int) -> bool:
    """The parts tile [0, count) exactly, in order."""
    position = 0
    for first, last, _ in parts:
        if first != position:
            return False
        position = last
    return position == count


def merge_if_complete(final: Path, count: int) -> bool:
    """Merge the parts into `final` once they hold all `count` samples; True when `final` is there.

    Under a lock, since the chunks of a job share the parts; the file appears whole (renamed
    into place) or not at all."""
    lock_path = final.with_suffix(".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        parts = _parts(final)
        if final.exists():
            shutil.rmtree(parts_dir(final), ignore_errors=True)  # a merge that died before cleaning
            return True
        if not _complete(parts, count):
            return False
        tmp = final.with_suffix(".parquet.tmp")
        write_tables((pq.ParquetFile(path).read() for _, _, path in parts), tmp,
                     pq.read_schema(parts[0][2]) if parts else schema(0))
        os.replace(tmp, final)
        shutil.rmtree(parts_dir(final), ignore_errors=True)
    lock_path.unlink(missing_ok=True)
    return True


def write_tables(tables: Iterable[pa.Table], path: Path, table_schema: pa.Schema) -> int:
    """Write `tables` in order into one file, in row groups of ROW_GROUP_ROWS (the last one
    shorter); the number of rows."""
    rows = 0
    held = pa.Table.from_batches([], schema=table_schema)
    with pq.ParquetWriter(path, table_schema, compression=COMPRESSION,
                          use_dictionary=DICTIONARY_COLUMNS) as writer:
        for table in tables:
            held = pa.concat_tables([held, table])
            while held.num_rows >= ROW_GROUP_ROWS:
                writer.write_table(held.slice(0, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
                held, rows = held.slice(ROW_GROUP_ROWS), rows + ROW_GROUP_ROWS
        if held.num_rows:
            writer.write_table(held, row_group_size=ROW_GROUP_ROWS)
            rows += held.num_rows
    return rows


def read_tables(path: Path, limit: int | None, offset: int) -> Iterator[pa.Table]:
    """Rows `offset` onwards (at most `limit`) of a job's Parquet file, a batch at a time."""
    skip, left = offset, limit
    for batch in pq.ParquetFile(path).iter_batches():
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        batch = batch.slice(skip, left)
        skip = 0
        yield pa.Table.from_batches([batch])
        if left is not None:
            left -= batch.num_rows
            if left <= 0:
                return


def read_rows(path: Path, limit: int | None, offset: int) -> Iterator[dict[str, Any]]:
    """The same rows shaped like `mxq.db.predictions.read` (top-k as [class, score] pairs)."""
    for table in read_tables(path, limit, offset):
        data = table.to_pydict()
        for i in range(table.num_rows):
            top = None
            if "top_k_classes" in data:
                top = [list(p) for p in zip(data["top_k_classes"][i], data["top_k_scores"][i],
                                            strict=True)]
            yield {"index": data["index"][i], "predicted_class": data["predicted_class"][i],
                   "score": data["score"][i], "top_k": top}
