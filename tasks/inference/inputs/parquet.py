"""The .parquet reader: one sample a row, from a list (or fixed-size list) column of numbers, or
from several numeric columns side by side; read a row group at a time, local or in a bucket.

Which columns: the ones asked (`columns`), else the file's only list column, else all its
columns when every one is a number. A list column's rows must all hold as many values (a sample
has one shape), and no value may be null: a model cannot score a missing number.
"""

from __future__ import annotations

import bisect
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from mxq.tasks.inference.inputs.files import InputError, Location, open_binary
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.source import Fetch, Samples

LISTED_COLUMNS = 10  # an error lists this many of a file's columns


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _listed(schema: pa.Schema) -> str:
    names = [f"{f.name} ({f.type})" for f in schema][:LISTED_COLUMNS]
    more = f", … ({len(schema)} columns)" if len(schema) > LISTED_COLUMNS else ""
    return ", ".join(names) + more


def _chosen(path: Location, schema: pa.Schema, columns: list[str] | None) -> list[str]:
    """The columns a sample is read from, checked against the file's schema."""
    if columns is None:
        return _guessed(path, schema)
    for name in columns:
        if name not in schema.names:
            raise InputError(f"input {path} has no column {name[:80]!r}; available: {_listed(schema)}")
    types = [schema.field(name).type for name in columns]
    if len(columns) == 1 and _is_list(types[0]):
        if not _numeric(types[0].value_type):
            raise InputError(f"input {path} column {columns[0]!r} holds lists of {types[0].value_type}, "
                             "not of numbers")
        return columns
    bad = [f"{n} ({t})" for n, t in zip(columns, types, strict=True) if not _numeric(t)]
    if bad:
        raise InputError(f"input {path} columns {', '.join(bad)} are not numbers (integers, floats "
                         "or booleans); a list column is read alone")
    return columns


def _guessed(path: Location, schema: pa.Schema) -> list[str]:
    """The columns of a sample when the job names none: the file's one list column, or all its
    columns when every one is numeric."""
    lists = [f.name for f in schema if _is_list(f.type)]
    if len(lists) == 1:
        return lists
    if not lists and all(_numeric(f.type) for f in schema):
        return list(schema.names)
    raise InputError(f"input {path} has columns {_listed(schema)}: choose the list column or "
                     "the numeric columns of a sample with --columns")


class _Groups:
    """A file's row groups of the sample's columns, read one at a time; the last one read is
    kept, so that the first, read to learn a list column's width, is not read again."""

    def __init__(self, path: Location, f: pq.ParquetFile, columns: list[str]) -> None:
        self.path, self.file, self.columns = path, f, columns
        self.starts = [0]
        for group in range(f.num_row_groups):
            self.starts.append(self.starts[-1] + f.metadata.row_group(group).num_rows)
        self.last: tuple[int, pa.Table] | None = None

    def read(self, group: int) -> pa.Table:
        if self.last is None or self.last[0] != group:
            self.last = None  # one group held at a time
            try:
                self.last = (group, self.file.read_row_group(group, columns=self.columns))
            except (pa.ArrowException, OSError) as e:
                raise InputError(f"input {self.path} row group {group} cannot be read: "
                                 f"{str(e)[:200]}") from None
        return self.last[1]


def _width(groups: _Groups) -> int:
    """How many values one row of the (single) list column holds: its fixed size, or its first
    row's."""
    t = groups.file.schema_arrow.field(groups.columns[0]).type
    if pa.types.is_fixed_size_list(t):
        return int(t.list_size)
    for group in range(groups.file.num_row_groups):
        first = groups.read(group).column(0).slice(0, 1).to_pylist()
        if first:
            return len(first[0] or [])
    raise InputError(f"input {groups.path} holds no rows")


def _matrix(path: Location, table: pa.Table, columns: list[str], width: int | None,
            first_row: int) -> NDArray[np.generic]:
    """One row group as a (rows, width) array: a list column's values, or the columns stacked."""
    if width is None:
        for name in columns:
            if table.column(name).null_count:
                raise InputError(f"input {path} column {name!r} has a null value in row "
                                 f"{first_row + _first_null(table.column(name))}")
        return np.stack([table.column(n).to_numpy() for n in columns], axis=1)
    lists = table.column(columns[0]).combine_chunks()
    if lists.null_count:
        raise InputError(f"input {path} column {columns[0]!r} has a null row: row "
                         f"{first_row + _first_null(lists)}")
    if not pa.types.is_fixed_size_list(lists.type):
        lengths = np.diff(np.asarray(lists.offsets))
        if (lengths != width).any():
            row = first_row + int(np.argmax(lengths != width))
            raise InputError(f"input {path} column {columns[0]!r} row {row} holds "
                             f"{int(lengths[row - first_row])} values, the first row {width}: "
                             "every sample must have one shape")
    values = lists.flatten()
    if values.null_count:  # the row holding the first null value
        at = _first_null(values)
        row = (at // width if pa.types.is_fixed_size_list(lists.type) else
               int(np.searchsorted(np.asarray(lists.offsets), at, side="right")) - 1)
        raise InputError(f"input {path} column {columns[0]!r} has a null value in row {first_row + row}")
    return np.asarray(values.to_numpy(zero_copy_only=False)).reshape(table.num_rows, width)


def _first_null(values: pa.Array | pa.ChunkedArray) -> int:
    """The index of the first null of `values` (which has one)."""
    return int(np.argmax(np.asarray(values.is_null().to_numpy(zero_copy_only=False))))


def _row_groups(groups: _Groups, width: int | None) -> Fetch:
    """Samples [start, stop) from the row groups they cover; the last one read stays decoded."""
    starts = groups.starts
    held: dict[int, NDArray[np.generic]] = {}

    def group_rows(group: int) -> NDArray[np.generic]:
        if group not in held:
            held.clear()
            held[group] = _matrix(groups.path, groups.read(group), groups.columns, width, starts[group])
        return held[group]

    def fetch(start: int, stop: int) -> NDArray[np.generic]:
        parts, at = [], start
        while at < stop:
            group = bisect.bisect_right(starts, at) - 1
            rows = group_rows(group)
            end = min(stop, starts[group + 1])
            parts.append(rows[at - starts[group]:end - starts[group]])
            at = end
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    return fetch


def _file(path: Location, raw: IO[bytes]) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(raw)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"input {path} is not a readable Parquet file: {str(e)[:200]}") from None


def count(path: Location) -> int:
    """The number of samples (rows), from the footer alone."""
    with open_binary(path, headers_only=True) as raw:
        return int(_file(path, raw).metadata.num_rows)


def opened(path: Location, columns: list[str] | None, limits: Limits) -> Samples:
    f = _file(path, open_binary(path))
    groups = _Groups(path, f, _chosen(path, f.schema_arrow, columns))
    width = _width(groups) if _is_list(f.schema_arrow.field(groups.columns[0]).type) else None
    rows = int(f.metadata.num_rows)
    limits.check_bytes(path, "", (rows, width or len(groups.columns)), np.dtype(np.float32))
    return Samples(rows, (width or len(groups.columns),), _row_groups(groups, width))
