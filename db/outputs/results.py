"""A job's predictions wherever its output kind stored them: SQL rows, or its Parquet file
(`--output parquet` keeps no rows in SQL). The CLI and the API read them through here.

Rows are a classifier's (class, score, top-k) or a multi-label model's (its kept labels in
top-k). A model that outputs other values (an embedding, regression values, a multi-label
model's Parquet file with its values) is read from its file, where they are arrays: asked here,
the job's rows are refused in one line saying where the file is (`ValuesOutput`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from mxq.db import registry
from mxq.db.outputs import parquet, predictions
from mxq.db.records import CLASSIFIER_OUTPUTS, HEADS, JobRecord, ModelRecord, PredictionRow
from mxq.db.stack import stack_id
from mxq.errors import MxqError, NotFound, Unavailable, UserError, first_line
from mxq.names import csv_cell
from mxq.objects import ObjectURLError, job_output
from mxq.status import JobStatus

PAGE_ROWS = 50_000  # rows read at a time by an export


class OutputMissing(Unavailable):
    """A job's output file is not where its record says (removed, or on another machine)."""


class OutputRemoved(NotFound):
    """The retention policy removed a job's output (MXQ_KEEP_OUTPUT_DAYS); its record stays."""


def _kept(record: JobRecord) -> None:
    if record.get("output_removed_at"):
        raise OutputRemoved(f"job {record['id']}'s output was removed by the retention policy on "
                            f"{record['output_removed_at']} (MXQ_KEEP_OUTPUT_DAYS; `mxq pin` keeps "
                            "a job's output); its record stays")


class ValuesOutput(UserError):
    """A job whose output is values, not rows of classes: read from its file as arrays."""


def _values_refused(record: JobRecord, where: Path | str, kind: str) -> ValuesOutput:
    return ValuesOutput(f"job {record['id']}'s model outputs {kind} values, stored as arrays in "
                        f"{where}: read them with NumPy, pyarrow, DuckDB or pandas, or through the API "
                        "(GET /api/v1/jobs/ID/values, the client's Job.values()); rows of classes and "
                        "scores are a classifier's")


def _check_rows_file(record: JobRecord, files: list[Path]) -> None:
    """A Parquet output of values (its `output` column) has no rows of classes to read here."""
    if files and parquet.holds_values(files[0]):
        raise _values_refused(record, files[0], "array")


def _version_of(url: str, record: JobRecord) -> ModelRecord | None:
    """The model version an inference job ran, or None when it is no longer registered."""
    params = record.get("params") or {}
    try:
        return registry.resolve(url, params["model"], params.get("model_version"))
    except (LookupError, KeyError):
        return None


def _check_rows_array(url: str, record: JobRecord, path: Path) -> None:
    """An npy output of a model that is no classifier or multi-label model holds values."""
    model = _version_of(url, record)
    if model is None:
        return  # the version is gone: its values are read as a classifier's were
    kind = model["outputs"]
    if kind not in (*CLASSIFIER_OUTPUTS, "multilabel"):
        files = (record.get("result") or {}).get("output_files") or {}
        where = ", ".join(files.values()) or path
        raise _values_refused(record, where, "several outputs'" if kind == HEADS else kind)


class OutputDamaged(Unavailable):
    """A job's output file is there but cannot be read: cut short, or not what it should be."""


@contextmanager
def _readable(record: JobRecord) -> Iterator[None]:
    """A job's output file that the Parquet or NumPy reader refuses (cut short, overwritten) as
    one line naming the job and the file's problem, not a traceback or a plain-text 500."""
    try:
        yield
    except MxqError:
        raise  # mxq's own one-line answer (a UserError is a ValueError too): not the file's fault
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise OutputDamaged(f"job {record['id']}'s output cannot be read: {first_line(exc, 200)} "
                            "(cut short or damaged? running the job again writes it anew)") from None


def output_file(home: Path, stack: str, job_id: int, suffix: str) -> Path:
    """Where a job's file output lives: `$MXQ_HOME/outputs/STACK/job-ID.npy` or `.parquet`,
    STACK the database's stack id (`mxq.db.stack`: another database, other files)."""
    return home / "outputs" / stack / f"job-{job_id}{suffix}"


def recorded_output(home: Path, url: str, record: JobRecord, suffix: str) -> Path:
    """The job's output file: the one its result names (jobs that finished before outputs were
    keyed by stack recorded theirs there), else where this stack keeps it."""
    shown = (record.get("result") or {}).get("output")
    if isinstance(shown, str) and shown.endswith(suffix):
        return Path(shown)
    return output_file(home, stack_id(url), record["id"], suffix)


def _missing(record: JobRecord, path: Path) -> OutputMissing:
    return OutputMissing(f"job {record['id']}'s output {path} is missing (removed, or this is not "
                         "the machine that wrote it)")


def _in_a_bucket(url: str, record: JobRecord, suffix: str) -> None:
    """A job whose output went to a bucket, which this layer does not read: where it is (as its
    result names it, else where this stack's job of that id writes it)."""
    prefix = (record.get("params") or {}).get("output_to")
    if not prefix:
        return
    shown = (record.get("result") or {}).get("output")
    try:
        where = shown if isinstance(shown, str) else job_output(prefix, stack_id(url), record["id"],
                                                                 suffix)
    except ObjectURLError:  # a job refused at submit for this very value: it wrote nothing
        return
    raise OutputMissing(f"job {record['id']}'s predictions are in the bucket, {where}: read them "
                        "there (NumPy, pyarrow, DuckDB, Spark)")


def _files_of(url: str, home: Path, record: JobRecord) -> list[Path] | None:
    """The Parquet files holding a job's rows: its merged file, or for a job that ended before
    its merge the parts it kept (cancelled, or failed: past its time limit it keeps what it
    committed, as its SQL or npy rows stay; any other failure removed them); None for a job
    whose rows are elsewhere (SQL, npy). A job that succeeded without its file raises
    OutputMissing: never 0 rows in silence."""
    params = record.get("params") or {}
    if params.get("output") != "parquet":
        return None
    _in_a_bucket(url, record, ".parquet")
    path = recorded_output(home, url, record, ".parquet")
    if path.exists():
        return [path]
    if record.get("status") in (JobStatus.CANCELLED, JobStatus.FAILED):
        return parquet.kept_parts(path)
    if record.get("status") == JobStatus.SUCCEEDED:
        raise _missing(record, path)
    return []


def _array_of(url: str, home: Path, record: JobRecord) -> NDArray[np.float32] | None:
    """An npy-only job's probabilities (memory-mapped); None for other outputs."""
    if (record.get("params") or {}).get("output") != "npy":
        return None
    _in_a_bucket(url, record, ".npy")
    path = recorded_output(home, url, record, ".npy")
    _check_rows_array(url, record, path)
    if path.exists():
        probs: NDArray[np.float32] = np.load(path, mmap_mode="r")
        return probs
    if record.get("status") == JobStatus.SUCCEEDED:
        raise _missing(record, path)
    return np.zeros((0, 1), dtype=np.float32)


def _stored(probs: NDArray[np.float32], record: JobRecord) -> NDArray[np.int64] | None:
    """The rows an npy output holds: None for all of them (a job that succeeded: nothing to
    scan), else those not all zeros (the rows a cancelled job computed)."""
    if record.get("status") == JobStatus.SUCCEEDED:
        return None
    return np.flatnonzero(probs.sum(axis=1) > 0)


def _array_rows(probs: NDArray[np.float32], record: JobRecord, limit: int | None,
                offset: int) -> list[PredictionRow]:
    """Rows `offset` onwards of an npy output, ranked as the SQL rows are."""
    top_k = int((record.get("params") or {}).get("top_k") or 0)
    stop = None if limit is None else offset + limit
    stored = _stored(probs, record)
    end = len(probs) if stop is None else min(len(probs), stop)
    chosen = np.arange(offset, end) if stored is None else stored[offset:stop]
    r = predictions.Ranked.of(np.asarray(probs[chosen]), top_k)
    return [{"index": int(i), "predicted_class": int(c), "score": float(v),
             "top_k": None if r.order is None or r.best is None else
             [(int(k), float(b)) for k, b in zip(r.order[n], r.best[n], strict=True)]}
            for n, (i, c, v) in enumerate(zip(chosen, r.classes, r.scores, strict=True))]


def read(url: str, home: Path, record: JobRecord, limit: int | None = None,
         offset: int = 0) -> list[PredictionRow]:
    """Rows `offset` onwards, at most `limit`, ordered by index."""
    _kept(record)
    files = _files_of(url, home, record)
    with _readable(record):
        if files is not None:
            _check_rows_file(record, files)
            return list(parquet.read_rows_of(files, limit, offset))
        probs = _array_of(url, home, record)
        if probs is not None:
            return _array_rows(probs, record, limit, offset)
    return predictions.read(url, record["id"], limit, offset)


def count(url: str, home: Path, record: JobRecord) -> int:
    _kept(record)
    files = _files_of(url, home, record)
    with _readable(record):
        if files is not None:
            return sum(parquet.rows_in(f) for f in files)
        probs = _array_of(url, home, record)
        if probs is not None:
            stored = _stored(probs, record)
            return len(probs) if stored is None else len(stored)
    return predictions.count(url, record["id"])


def _output_heads(url: str, record: JobRecord) -> list[tuple[str, int]]:
    """The job's outputs as its model version names them, (name, width) in order: one named
    `output`, or each of several."""
    model = _version_of(url, record)
    if model is None:
        raise NotFound(f"job {record['id']}'s model version is no longer registered: its outputs "
                       "cannot be told apart")
    return [(h["name"], h["width"]) for h in model.get("heads") or []] or [("output", model["classes"])]


def values(url: str, home: Path, record: JobRecord, output: str | None = None,
           limit: int | None = None, offset: int = 0) -> tuple[NDArray[np.float32], int]:
    """Rows `offset` onwards (at most `limit`) of one of the job's outputs (`output`: its name,
    None for a model's only one), as its model gave them: (rows, width) float32, read from its
    .npy or its Parquet column (a classifier's Parquet file keeps classes and scores instead:
    ValuesOutput); and how many rows the output holds. NotFound for an output the model does
    not have."""
    _kept(record)
    heads = _output_heads(url, record)
    names = [n for n, _ in heads]
    name = output or names[0]
    if output is None and len(heads) > 1:
        raise NotFound(f"job {record['id']} has {len(heads)} outputs ({', '.join(names)}): name one")
    if name not in names:
        raise NotFound(f"job {record['id']} has no output {output!r}; its outputs: {', '.join(names)}")
    stop = None if limit is None else offset + limit
    with _readable(record):
        files = _files_of(url, home, record)
        if files is not None:
            return (_column_values(record, files, name, offset, limit),
                    sum(parquet.rows_in(f) for f in files))
        path = _values_file(url, home, record, name, len(heads) > 1)
        if path is None:
            raise ValuesOutput(f"job {record['id']} stored SQL rows (`--output db`): read its "
                               f"predictions (GET /api/v1/jobs/{record['id']}/predictions, "
                               f"`mxq results {record['id']}`); values are kept by --output npy "
                               "or parquet")
        stored = np.load(path, mmap_mode="r")
        return np.array(stored[offset:stop], dtype=np.float32), len(stored)


def _values_file(url: str, home: Path, record: JobRecord, name: str, several: bool) -> Path | None:
    """The .npy holding output `name` of a job (`job-ID.NAME.npy` of several), or None for a
    job that stored SQL rows only."""
    params = record.get("params") or {}
    if params.get("output") not in ("npy", "both"):
        return None
    _in_a_bucket(url, record, ".npy")
    if several:
        files = (record.get("result") or {}).get("output_files") or {}
        path = Path(files[name]) if name in files else output_file(home, stack_id(url), record["id"],
                                                                   f".{name}.npy")
    else:
        path = recorded_output(home, url, record, ".npy")
    if not path.exists():
        raise _missing(record, path)
    return path


def _column_values(record: JobRecord, files: list[Path], name: str, offset: int,
                   limit: int | None) -> NDArray[np.float32]:
    """Output `name`'s values from a job's Parquet files: its column, fixed-size lists or one
    float32 a row."""
    if files and name not in parquet.columns_of(files[0]):
        raise ValuesOutput(f"job {record['id']}'s Parquet file keeps a classifier's classes and "
                           "scores, not its probabilities: read its predictions, or run it with "
                           "--output npy for the values")
    parts = [t.column(name).combine_chunks() for t in parquet.read_tables_of(files, limit, offset)]
    if not parts:
        return np.zeros((0, 0), np.float32)
    return np.concatenate([_as_matrix(p) for p in parts])


def _as_matrix(column: pa.Array) -> NDArray[np.float32]:
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        return np.asarray(column.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, width)
    return np.asarray(column.to_numpy(zero_copy_only=False), np.float32).reshape(-1, 1)


def _pages(url: str, home: Path, record: JobRecord, limit: int | None,
           offset: int) -> Iterator[list[PredictionRow]]:
    """The job's rows from `offset` (at most `limit`), a page of PAGE_ROWS at a time."""
    while limit is None or limit > 0:
        size = PAGE_ROWS if limit is None else min(PAGE_ROWS, limit)
        page = read(url, home, record, size, offset)
        if not page:
            return
        yield page
        offset += len(page)
        limit = None if limit is None else limit - len(page)


def export_parquet(url: str, home: Path, record: JobRecord, out: Path, limit: int | None = None,
                   offset: int = 0) -> int:
    """Write the job's stored predictions to `out` as Parquet; the number of rows written."""
    top_k = int((record.get("params") or {}).get("top_k") or 0)
    files = _files_of(url, home, record)
    tables = (parquet.read_tables_of(files, limit, offset) if files is not None else
              (parquet.from_rows(page, top_k) for page in _pages(url, home, record, limit, offset)))
    tmp = out.with_name(out.name + ".tmp")
    rows = parquet.write_tables(tables, tmp, parquet.schema(top_k))
    tmp.replace(out)
    return rows


def prediction_csv(rows: list[PredictionRow]) -> Iterator[list[object]]:
    """The predictions' CSV, the same from the CLI and the API: `index,predicted_class,score`,
    then `top_1,top_score_1,…` when top-k was stored; the header first. Every stored value goes
    through `csv_cell`, as every CSV mxq writes (the score is a number's own text)."""
    k = max((len(r["top_k"] or []) for r in rows), default=0)
    yield ["index", "predicted_class", "score",
           *[f"{h}_{i}" for i in range(1, k + 1) for h in ("top", "top_score")]]
    for r in rows:
        pairs = [csv_cell(v) for pair in (r["top_k"] or []) for v in pair]
        yield [csv_cell(r["index"]), csv_cell(r["predicted_class"]), f"{r['score']:.6g}", *pairs]
