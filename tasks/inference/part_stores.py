"""Where a streaming Parquet output keeps its parts and its merged file: a folder on the worker's
disk (`LocalParts`, over `mxq.db.outputs.parquet`), or a bucket prefix (`BucketParts`), so that
the chunks of one job on nodes with no shared folder write one output.

In a bucket, each flush is one part object written by a single PUT (complete or absent) before
the job commits its position; a later attempt deletes the parts past the committed position. The
last chunk merges the parts in order, one at a time, into a local temporary file and uploads it
as `STACK/job-ID.parquet` (multipart: the object appears whole, or not at all), then deletes the
parts it listed, by their exact keys.
Every object is written conditionally (If-None-Match: *) with metadata naming the job
(`BucketParts.writer`): an object already at a key is accepted only as this job's own earlier
write, and a merge reads, and a clean-up deletes, only objects the job wrote; another writer's
object at one of the job's keys fails the job naming it (`s3.ObjectTaken`), and stays.
The merge holds a Redis lock, since chunks on several nodes may finish together; a merge killed
mid-upload leaves an unfinished multipart upload, which the next merge aborts. An `.npy` output
in a bucket keeps its parts the same way (each a Parquet table of `index` and `probabilities`)
and merges them into `job-ID.npy`, written into a local memory-mapped file a part at a time.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path, PurePosixPath
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from mxq.db.outputs import parquet
from mxq.db.outputs.parquet import Part
from mxq.objects import ObjectURL
from mxq.tasks.inference.inputs.files import open_binary
from mxq.tasks.inference.inputs.npy import read_header
from mxq.workers.broker.redis_client import client as redis_client
from mxq.workers.settings import Settings
from mxq.workers.storage import client as s3
from mxq.workers.storage.ranged import RemoteObject

MERGE_LOCK_SECONDS = 3600  # longest a merge may hold the lock (then another may take it over)


class PartStore(Protocol):
    """What a streaming Parquet output does with its parts, wherever they are kept."""

    @property
    def shown(self) -> str: ...
    def write_part(self, tables: list[pa.Table], tag: str) -> str | None: ...
    def remove_part(self, part: str) -> None: ...
    def drop_parts(self, start: int, stop: int) -> None: ...
    def covers(self, start: int, stop: int) -> bool: ...
    def merge_if_complete(self, count: int) -> bool: ...
    def rows_in(self) -> int: ...
    def missing(self, count: int) -> str: ...
    def remove_all(self) -> None: ...


@dataclass(frozen=True)
class LocalParts:
    """Parts in `job-ID.parquet.parts/` beside the merged file, on this worker's disk."""

    final: Path

    @property
    def shown(self) -> str:
        return str(self.final)

    def write_part(self, tables: list[pa.Table], tag: str) -> str | None:
        path = parquet.write_part(self.final, tables, tag)
        return None if path is None else str(path)

    def remove_part(self, part: str) -> None:
        parquet.remove_part(Path(part))

    def drop_parts(self, start: int, stop: int) -> None:
        parquet.drop_parts(self.final, start, stop)

    def covers(self, start: int, stop: int) -> bool:
        return parquet.covers(self.final, start, stop)

    def merge_if_complete(self, count: int) -> bool:
        return parquet.merge_if_complete(self.final, count)

    def rows_in(self) -> int:
        return parquet.rows_in(self.final)

    def missing(self, count: int) -> str:
        return parquet.missing(parquet.part_list(self.final), count)

    def remove_all(self) -> None:
        parquet.remove_all(self.final)


@dataclass(frozen=True)
class BucketParts:
    """Parts under `PREFIX/STACK/job-ID.parquet.parts/` in a bucket, merged into
    `PREFIX/STACK/job-ID.parquet`."""

    settings: Settings
    final: ObjectURL
    scratch: Path  # where a merge writes its temporary file
    classes: int | None = None  # an .npy output's: its parts hold probabilities, merged into .npy

    @property
    def shown(self) -> str:
        return str(self.final)

    @property
    def writer(self) -> str:
        """The job its objects' metadata names (`STACK/job-ID`, from the final key): every write
        is conditional (If-None-Match: *), and an object there already is this job's only when it
        names the job (an earlier attempt's, a merge done before a crash); another writer's is
        never replaced, merged or deleted (`s3.ObjectTaken`)."""
        key = PurePosixPath(self.final.key)
        return f"{key.parent.name}/{key.name.split('.')[0]}"

    def _prefix(self) -> ObjectURL:
        return ObjectURL(self.final.bucket, self.final.key + ".parts/")

    def _parts(self) -> list[Part]:
        """The part objects, as `mxq.db.outputs.parquet` names parts (their key in place of a
        path): only those directly under the parts prefix and named as parts are, so a merge or a
        clean-up never takes (or deletes) another job's objects written deeper under it."""
        found = []
        prefix = self._prefix().key
        for key, _, _ in s3.listed(self.settings, self._prefix()):
            if "/" in key[len(prefix):]:
                continue
            part = parquet.part_of(Path(PurePosixPath(key).name))
            if part is not None:
                found.append((*part[:3], Path(key)))
        return sorted(found)

    def write_part(self, tables: list[pa.Table], tag: str) -> str | None:
        named = parquet.named_part(tables, tag)
        if named is None:
            return None
        table, name = named
        buf = io.BytesIO()
        parquet.write_part_table(table, buf)
        key = self._prefix().key + name
        s3.create(self.settings, ObjectURL(self.final.bucket, key), buf.getvalue(), self.writer)
        return key

    def remove_part(self, part: str) -> None:
        s3.delete(self.settings, self.final, [part])  # the one this attempt just wrote

    def _delete_own(self, keys: list[str]) -> None:
        s3.delete(self.settings, self.final, s3.owned(self.settings, self.final, keys, self.writer))

    def drop_parts(self, start: int, stop: int) -> None:
        self._delete_own([str(key) for first, _, _, key in self._parts() if start <= first < stop])

    def covers(self, start: int, stop: int) -> bool:
        if s3.own(self.settings, self.final, self.writer):
            return True
        return parquet.chain_end(self._parts(), start) >= stop

    def merge_if_complete(self, count: int) -> bool:
        lock = redis_client(self.settings.broker).lock(f"mxq:merge:{self.final}",
                                                        timeout=MERGE_LOCK_SECONDS)
        with lock:
            found = self._parts()  # listed once: what is merged, and what is deleted after
            read: list[str] = []  # parts the merge read, each checked as this job's
            if not s3.own(self.settings, self.final, self.writer):  # (else merged before a crash)
                parts, held = parquet.tiling(found)
                if held != count:
                    return False
                s3.abort_uploads(self.settings, self.final)  # a merge that died mid-upload
                self._merge(parts)
                read = [str(p[3]) for p in parts]
            s3.delete(self.settings, self.final, read)
            self._delete_own([str(p[3]) for p in found if str(p[3]) not in read])
        return True

    def _merge(self, parts: list[Part]) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.scratch, suffix=self.final.suffix) as tmp:
            tables = (self._read(str(key)) for *_, key in parts)
            if self.classes is not None:
                _write_npy(tables, Path(tmp.name), parts[-1][1] if parts else 0, self.classes)
            elif (first := next(tables, None)) is not None:  # its schema is every part's
                parquet.write_tables(chain([first], tables), Path(tmp.name), first.schema)
            else:
                parquet.write_tables([], Path(tmp.name), parquet.schema(0))
            s3.create_from(self.settings, tmp.name, self.final, self.writer)

    def _read(self, key: str) -> pa.Table:
        """A part whole (one flush), from one GET: only one this job wrote."""
        part = ObjectURL(self.final.bucket, key)
        return pq.read_table(io.BytesIO(s3.get(self.settings, part, writer=self.writer)))

    def rows_in(self) -> int:
        final = RemoteObject.at(self.settings, self.final)
        with open_binary(final, headers_only=True) as f:
            if self.classes is not None:
                return read_header(f, final)[0][0]
            return int(pq.ParquetFile(f).metadata.num_rows)

    def missing(self, count: int) -> str:
        return parquet.missing(self._parts(), count)

    def remove_all(self) -> None:
        self._delete_own([str(p[3]) for p in self._parts()])
        s3.abort_uploads(self.settings, self.final)


def probability_part(first: int, probs: NDArray[np.float32]) -> pa.Table:
    """One batch of an `.npy` output kept in a bucket: its sample indexes and probabilities."""
    flat = pa.array(np.ascontiguousarray(probs, dtype=np.float32).ravel())
    return pa.table({"index": pa.array(np.arange(first, first + len(probs), dtype=np.int64)),
                     "probabilities": pa.FixedSizeListArray.from_arrays(flat, probs.shape[1])})


def _write_npy(tables: Iterator[pa.Table], path: Path, rows: int, classes: int) -> None:
    """The parts, in order, written into one (rows, classes) float32 .npy a part at a time."""
    out = np.lib.format.open_memmap(  # type: ignore[no-untyped-call]  # untyped in NumPy 1.23's stubs
        path, mode="w+", dtype=np.float32, shape=(rows, classes))
    for table in tables:
        index = table.column("index").to_numpy()
        values = table.column("probabilities").combine_chunks().flatten().to_numpy()
        out[index[0]:index[-1] + 1] = values.reshape(len(index), classes)
    out.flush()
    del out
