"""Predictions as Parquet: the part files a streaming job writes, their merge into one file,
and the export of a job's stored rows.

A job writing Parquet (`--output parquet`) stores each flush as one part file, named by the
range it holds and by the attempt that wrote it (`first-last.j<job>a<attempt>.parquet`), before it
commits that position in SQL; a later attempt drops the parts past the committed position and goes
on. An attempt that was paused and came back after its job was handed on may still write a part
before its commit is refused: the name keeps it apart, it removes it itself, and the merge never
takes it (where two parts start at one sample, the later attempt's is the one its job committed).
When every part of the job's samples is there (the last chunk of a chunked job to finish sees it),
the parts are merged, in order and one at a time, into `job-ID.parquet`. Memory stays bounded by
a part, never by the job.

Columns of a classifier's predictions: `index` (int64), `predicted_class` (int32), `score`
(float32), and with top-k `top_k_classes` (list of int32) and `top_k_scores` (list of float32),
best first. Of any other output kind (`mxq.db.records.OUTPUT_KINDS`): `index` and `output`, the
sample's values as a fixed-size list of float32 (one regression value: a float32), which pyarrow,
DuckDB and pandas read as arrays; a multi-label model's also `labels` (list of int32), the labels
kept, best first. Of a model with several outputs: `index`, then per output NAME its values, and
NAME_class, NAME_score (and top-k lists) for a classifier output, NAME_labels for a multi-label
one (`from_heads`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from mxq.db.outputs.predictions import Ranked, kept_labels
from mxq.db.records import CLASSIFIER_OUTPUTS, Head, PredictionRow

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


def value_schema(kind: str, width: int) -> pa.Schema:
    """The columns of a job whose model outputs `kind` values, `width` per sample."""
    value = pa.float32() if _scalar(kind, width) else pa.list_(pa.float32(), width)
    fields = [pa.field("index", pa.int64()), pa.field("output", value)]
    if kind == "multilabel":
        fields.append(pa.field("labels", pa.list_(pa.int32())))
    return pa.schema(fields)


def _scalar(kind: str, width: int) -> bool:
    """Whether an output's values are one float32 a row (a single regression value), not lists."""
    return kind == "regression" and width == 1


def from_values(first: int, values: NDArray[np.float32], kind: str,
                labels: list[list[tuple[int, float]]] | None = None) -> pa.Table:
    """The rows of one batch of `kind` values (sample `first` onwards); `labels`: a multi-label
    model's kept labels per sample (`predictions.kept_labels`)."""
    table_schema = value_schema(kind, values.shape[1])
    output = _values_column(values, _scalar(kind, values.shape[1]))
    columns: list[Any] = [np.arange(first, first + len(values), dtype=np.int64), output]
    if kind == "multilabel":
        columns.append(pa.array([[c for c, _ in kept] for kept in labels or []], pa.list_(pa.int32())))
    return pa.Table.from_arrays(columns, schema=table_schema)


def columns_of(path: Path) -> list[str]:
    """The columns of a job's Parquet file, from its footer."""
    return list(pq.read_schema(path).names)


def holds_values(path: Path) -> bool:
    """Whether a job's file holds values (`output`, or several outputs' columns), not a
    classifier's rows."""
    return "predicted_class" not in columns_of(path)


def _values_column(values: NDArray[np.float32], scalar: bool) -> pa.Array:
    """(n, width) float32 values as one float32 per row (`scalar`), or fixed-size lists."""
    flat = np.ascontiguousarray(values, dtype=np.float32)
    if scalar:
        return pa.array(flat[:, 0])
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), values.shape[1])


def from_heads(first: int, values: NDArray[np.float32], heads: list[Head], top_k: int,
               threshold: float | None) -> pa.Table:
    """The rows of one batch of a model with several outputs (`values`: each output's columns
    side by side, in the order of `heads`): `index`, then per output NAME its values (a
    classifier's probabilities), and NAME_class and NAME_score (with top-k NAME_top_k_classes
    and NAME_top_k_scores) for a classifier, NAME_labels for multi-label."""
    columns: dict[str, Any] = {"index": pa.array(np.arange(first, first + len(values), dtype=np.int64))}
    at = 0
    for head in heads:
        part, at = values[:, at:at + head["width"]], at + head["width"]
        name, kind = head["name"], head["kind"]
        columns[name] = _values_column(part, _scalar(kind, head["width"]))
        if kind in CLASSIFIER_OUTPUTS:
            r = Ranked.of(part, top_k)
            columns[f"{name}_class"] = pa.array(r.classes.astype(np.int32))
            columns[f"{name}_score"] = pa.array(r.scores.astype(np.float32))
            if r.order is not None and r.best is not None:
                columns[f"{name}_top_k_classes"] = _lists(r.order.astype(np.int32), pa.int32())
                columns[f"{name}_top_k_scores"] = _lists(r.best.astype(np.float32), pa.float32())
        elif kind == "multilabel":
            kept = kept_labels(part, threshold, top_k)
            columns[f"{name}_labels"] = pa.array([[c for c, _ in k] for k in kept], pa.list_(pa.int32()))
    return pa.table(columns)


def from_rows(rows: list[PredictionRow], top_k: int) -> pa.Table:
    """Stored prediction rows (`mxq.db.outputs.predictions.read`) as a table."""
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


Part = tuple[int, int, int, Path]  # first, last (exclusive), attempt, file


def part_of(path: Path) -> Part | None:
    """A part file's range and attempt from its name; None for anything else in the folder."""
    span, _, tag = path.stem.partition(".")
    first, _, last = span.partition("-")
    attempt = tag.rpartition("a")[2]
    if not (first.isdigit() and last.isdigit() and attempt.isdigit()):
        return None
    return int(first), int(last), int(attempt), path


def part_list(final: Path) -> list[Part]:
    """The part files of `final`, sorted by (first, last, attempt)."""
    folder = parts_dir(final)
    if not folder.is_dir():
        return []
    return sorted(p for p in map(part_of, folder.glob("*.parquet")) if p is not None)


def named_part(tables: list[pa.Table], tag: str) -> tuple[pa.Table, str] | None:
    """One flush's tables as one part and its name, from the range it holds and the attempt
    (`tag`, `Fence.tag`) that wrote it; None for no rows. Parts on disk and in a bucket share it."""
    table = pa.concat_tables(tables)
    if not table.num_rows:
        return None
    index = table.column("index")
    first, last = index[0].as_py(), index[-1].as_py() + 1
    return table, f"{first:012d}-{last:012d}.{tag}.parquet"


def write_part_table(table: pa.Table, where: Path | BinaryIO) -> None:
    """A part as Parquet (uncompressed: parts live until the merge), to a file or a buffer."""
    pq.write_table(table, where, compression=PART_COMPRESSION, use_dictionary=DICTIONARY_COLUMNS)


def write_part(final: Path, tables: list[pa.Table], tag: str) -> Path | None:
    """One flush of a streaming job as its part file, complete on disk before the job commits it;
    `tag` names the attempt (`Fence.tag`). The file written, or None for no rows."""
    named = named_part(tables, tag)
    if named is None:
        return None
    table, name = named
    folder = parts_dir(final)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    tmp = path.with_suffix(".tmp")
    write_part_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def drop_parts(final: Path, start: int, stop: int) -> None:
    """Remove the parts that begin in [start, stop): written by an attempt that died before it
    committed them (a new attempt writes them again)."""
    for first, _, _, path in part_list(final):
        if start <= first < stop:
            path.unlink(missing_ok=True)


def remove_part(path: Path) -> None:
    """Take back a part this attempt wrote but could not commit (its job was handed on), and
    the parts folder with it when nothing else is left there."""
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass  # other parts are there (or the folder is gone already)


def remove_all(final: Path) -> None:
    """A job that failed or was cancelled: its parts (and a merge's leftovers) go."""
    shutil.rmtree(parts_dir(final), ignore_errors=True)
    final.with_suffix(".parquet.tmp").unlink(missing_ok=True)
    final.with_suffix(".lock").unlink(missing_ok=True)


def _latest(parts: list[Part]) -> dict[int, Part]:
    """Each start's part: where two start at one sample, the later attempt's (an earlier, paused
    attempt's part was never committed). `parts` sorted, so the highest attempt comes last."""
    return {part[0]: part for part in parts}


def _chain(latest: dict[int, Part], start: int) -> tuple[list[Part], int]:
    """The parts that hold [start, n) in order with no overlap, and n."""
    chain, position = [], start
    while position in latest:
        chain.append(latest[position])
        position = latest[position][1]
    return chain, position


def tiling(parts: list[Part]) -> tuple[list[Part], int]:
    """The parts that hold [0, n) in order with no overlap, and n."""
    return _chain(_latest(parts), 0)


def missing(parts: list[Part], count: int) -> str:
    """Where the parts stop holding [0, count): e.g. "samples [4096, 8192)"."""
    _, position = tiling(parts)
    later = [p[0] for p in parts if p[0] > position]
    return f"samples [{position}, {min(later, default=count)})"


def merge_if_complete(final: Path, count: int) -> bool:
    """Merge the parts into `final` once they hold all `count` samples; True when `final` is there.

    Under a lock, since the chunks of a job share the parts; the file appears whole (renamed
    into place) or not at all."""
    lock_path = final.with_suffix(".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.exists():
            shutil.rmtree(parts_dir(final), ignore_errors=True)  # a merge that died before cleaning
            return True
        parts, held = tiling(part_list(final))
        if held != count:
            return False
        tmp = final.with_suffix(".parquet.tmp")
        write_tables((pq.ParquetFile(path).read() for *_, path in parts), tmp,
                     pq.read_schema(parts[0][3]) if parts else schema(0))
        os.replace(tmp, final)
        shutil.rmtree(parts_dir(final), ignore_errors=True)
    lock_path.unlink(missing_ok=True)
    return True


def chain_end(parts: list[Part], start: int) -> int:
    """How far the parts hold the samples from `start` on, in order with no gap."""
    return _chain(_latest(parts), start)[1]


def covers(final: Path, start: int, stop: int) -> bool:
    """The merged file is there, or the parts hold [start, stop) of it (a chunk's own range)."""
    return final.exists() or chain_end(part_list(final), start) >= stop


def rows_in(final: Path) -> int:
    """Rows of a merged file, from its footer (no data read)."""
    return int(pq.ParquetFile(final).metadata.num_rows)


def kept_parts(final: Path) -> list[Path]:
    """The part files of a job that stopped before its merge (cancelled, or past its time limit),
    in sample order, none overlapping another (the later attempt's where two start at one
    sample)."""
    kept, end = [], 0
    for first, last, _, path in sorted(_latest(part_list(final)).values()):
        if first >= end:
            kept.append(path)
            end = last
    return kept


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


def read_tables_of(paths: list[Path], limit: int | None, offset: int) -> Iterator[pa.Table]:
    """`read_tables` over several files in order, as if they were one."""
    for path in paths:
        rows = rows_in(path)
        if offset >= rows:
            offset -= rows
            continue
        for table in read_tables(path, limit, offset):
            yield table
            if limit is not None:
                limit -= table.num_rows
        if limit is not None and limit <= 0:
            return
        offset = 0


def read_rows_of(paths: list[Path], limit: int | None, offset: int) -> Iterator[PredictionRow]:
    """The rows of `paths` shaped like `mxq.db.outputs.predictions.read` (top-k as [class, score] pairs)."""
    for table in read_tables_of(paths, limit, offset):
        data = table.to_pydict()
        for i in range(table.num_rows):
            top = None
            if "top_k_classes" in data:
                top = list(zip(data["top_k_classes"][i], data["top_k_scores"][i], strict=True))
            yield {"index": data["index"][i], "predicted_class": data["predicted_class"][i],
                   "score": data["score"][i], "top_k": top}
