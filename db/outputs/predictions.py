"""Per-sample inference results, written in bulk and read back in pages."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, TypeGuard, cast

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, delete, func, select, update
from sqlalchemy.orm import Session

from mxq.db.engine import get_engine, session_scope
from mxq.db.fence import Fence, RunCheck, still_ours
from mxq.db.records import PredictionRow
from mxq.db.retry import db_retry
from mxq.db.schema import Job, Prediction, utcnow


@db_retry
def replace_range(url: str, fence: Fence, owner: int, start: int, stop: int) -> bool:
    """Clear `owner`'s rows in [start, stop) before attempt `fence` (re)writes them, so that a
    redelivered chunk never duplicates rows; False (nothing cleared) when the job is no longer the
    attempt's. Checked in the clear's own transaction: a superseded attempt whose clear came late
    (behind a locked database, or a retry's back-off) deleted the rows its successor had
    committed meanwhile, and the successor succeeded without them (33,280 of 100,000, in CI)."""
    with session_scope(url) as session:
        if not still_ours(session, fence):
            return False
        clear(session, [owner], start, stop)
        return True


def clear(session: Session, owners: list[int], start: int = 0, stop: int | None = None) -> None:
    """Inside the caller's transaction: delete the rows of `owners` in [start, stop)."""
    where = [Prediction.job_id.in_(owners), Prediction.idx >= start]
    if stop is not None:
        where.append(Prediction.idx < stop)
    session.execute(delete(Prediction).where(*where))


COLUMNS = ("job_id", "idx", "predicted_class", "score", "top_k")
Row = tuple[int, int, int, float, str | None]  # top_k as JSON text


@dataclass(frozen=True)
class Block:
    """One read's rows of job `owner` from sample `first`, kept as NumPy columns until written:
    PostgreSQL copies a block without top-k straight from its arrays (`_binary_copy`); other
    writes take its `rows`. Built as Python tuples where the job computes, a million rows cost
    its worker about 1.5 s of CPU beside the model's own 1.6 s."""

    owner: int
    first: int
    classes: NDArray[np.int64]
    scores: NDArray[np.float32]
    top_k: list[str] | None = None  # each sample's top-k or kept labels as JSON, where asked

    def rows(self) -> list[Row]:
        return list(zip(*self.columns(len(COLUMNS)), strict=False))  # (repeat never ends)

    def columns(self, count: int) -> list[Iterable[Any]]:
        """The first `count` of COLUMNS, each as Python values (the job's id repeated)."""
        cols: list[Iterable[Any]] = [repeat(self.owner), range(self.first, self.first + len(self.classes)),
                                     self.classes.tolist(), self.scores.tolist()]
        if count == len(COLUMNS):
            cols.append(repeat(None) if self.top_k is None else self.top_k)
        return cols


Rows = Sequence[Row | Block]
"""What one write stores: rows, or blocks of them."""


@dataclass(frozen=True)
class Ranked:
    """One batch of probabilities ranked: each sample's class and score, and with top-k its
    k best classes and their probabilities, best first (`order` and `best` are (n, k))."""

    classes: NDArray[np.int64]
    scores: NDArray[np.float32]
    order: NDArray[np.int64] | None
    best: NDArray[np.float32] | None

    @classmethod
    def of(cls, probs: NDArray[np.float32], top_k: int) -> Ranked:
        classes = probs.argmax(axis=1)
        scores = probs[np.arange(len(probs)), classes]
        if not top_k:
            return cls(classes, scores, None, None)
        order = np.argsort(-probs, axis=1)[:, :top_k]
        return cls(classes, scores, order, np.take_along_axis(probs, order, axis=1))


def kept_labels(probs: NDArray[np.float32], threshold: float | None,
                top_k: int) -> list[list[tuple[int, float]]]:
    """A multi-label model's labels kept per sample, best first, as (label, probability): those
    at or above `threshold`, at most `top_k` of them (0: no limit); with neither given, those at
    or above 0.5."""
    least = 0.5 if threshold is None and not top_k else (threshold or 0.0)
    order = np.argsort(-probs, axis=1, kind="stable")
    if top_k:
        order = order[:, :top_k]
    ranked = np.take_along_axis(probs, order, axis=1)
    return [[(int(c), float(v)) for c, v in zip(o, r, strict=True) if v >= least]
            for o, r in zip(order.tolist(), ranked.tolist(), strict=True)]


@db_retry
def write(url: str, rows: Rows) -> None:
    """Store rows in one bulk write (see `_insert`)."""
    if not rows:
        return
    with get_engine(url).begin() as conn:
        _insert(conn, rows)


@db_retry
def commit(url: str, fence: Fence, rows: Rows, position: int) -> RunCheck:
    """Store `rows` and move the job's committed position to `position`, in one transaction.

    Only for the attempt that runs the job: LOST (nothing stored) when it is not its own any more;
    else what the attempt should do next, as `jobs.run_check` says it, from the same statement.
    Rows and position move together, so a later attempt resumes right after the last stored
    sample, with nothing lost and nothing written twice."""
    with get_engine(url).begin() as conn:
        moved = conn.execute(update(Job).where(*fence.holds())
                             .values(committed=position, heartbeat_at=utcnow())
                             .returning(Job.cancel_requested_at, Job.preempt_for)).one_or_none()
        if moved is None:  # nothing was changed: there is nothing to undo
            return RunCheck.LOST
        _insert(conn, rows)
    return RunCheck.of(moved.cancel_requested_at, moved.preempt_for)


def add(session: Session, rows: Rows) -> None:
    """Inside the caller's transaction: store rows (see `_insert`)."""
    _insert(session.connection(), rows)


def _insert(conn: Connection, written: Rows) -> None:
    """COPY on PostgreSQL, a driver-level executemany of multi-row INSERTs elsewhere.

    Both skip per-value ORM processing, which on a busy worker costs more CPU than the model.
    """
    if not written:
        return
    if conn.dialect.name == "postgresql":
        _copy(conn, written)
        return
    mark = _MARK[conn.dialect.paramstyle]
    columns = len(COLUMNS) if any(_has_top_k(r) for r in written) else len(COLUMNS) - 1
    values = list(chain.from_iterable(_values(r, columns) for r in written))
    width = ROWS_PER_INSERT * columns
    whole, rest = divmod(len(values), width)
    if whole:
        conn.exec_driver_sql(_insert_sql(mark, columns, ROWS_PER_INSERT),
                             [tuple(values[i:i + width]) for i in range(0, whole * width, width)])
    if rest:
        conn.exec_driver_sql(_insert_sql(mark, columns, rest // columns), tuple(values[whole * width:]))


def _has_top_k(r: Row | Block) -> bool:
    return (r.top_k if isinstance(r, Block) else r[4]) is not None


def _values(r: Row | Block, columns: int) -> Iterable[object]:
    """The values of a row or of a block's rows, the first `columns` of COLUMNS of each, in
    order. A block's go through `zip` (which reuses its tuple) into the caller's flat list: a
    tuple per row, kept, had the collector walk every one of them again and again (a third of a
    SQLite flush's CPU)."""
    if not isinstance(r, Block):
        return r[:columns]
    return chain.from_iterable(zip(*r.columns(columns), strict=False))  # (repeat never ends)


def _tuples(written: Rows) -> list[Row]:
    return list(chain.from_iterable(r.rows() if isinstance(r, Block) else (r,) for r in written))


def _copy(conn: Connection, written: Rows) -> None:
    """Blocks without top-k in one binary COPY built by NumPy (`_binary`), the rest as text rows."""
    plain = [r for r in written if _binary(r)]
    rest = [r for r in written if not _binary(r)]
    with cast(Any, conn.connection).cursor() as cur:
        if plain:
            with cur.copy(f"COPY predictions ({', '.join(COLUMNS[:4])}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(_binary_copy(plain))
        if rest:
            with cur.copy(f"COPY predictions ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for row in _tuples(rest):
                    copy.write_row(row)


# PostgreSQL's binary COPY of (job_id, idx, predicted_class, score): its signature, flags and
# header extension length; then per row the field count and each field's length and value, in
# network order; then -1 as the end (www.postgresql.org/docs/current/sql-copy.html). Text rows
# cost the worker about 1.5 µs each to build and send, and the server about as much to parse.
_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_BINARY_END = b"\xff\xff"
_BINARY_ROW = np.dtype([("fields", ">i2"), ("job_id_size", ">i4"), ("job_id", ">i4"),
                        ("idx_size", ">i4"), ("idx", ">i4"), ("class_size", ">i4"),
                        ("predicted_class", ">i4"), ("score_size", ">i4"), ("score", ">f8")])
_INT4_MAX = 2**31 - 1


def _binary(r: Row | Block) -> TypeGuard[Block]:
    """Whether `r` goes by binary COPY: a block without top-k whose numbers fit the int4 columns
    (NumPy would wrap one that does not; as text, the server refuses it, naming the column)."""
    return (isinstance(r, Block) and r.top_k is None
            and max(r.owner, r.first + len(r.classes) - 1) <= _INT4_MAX and r.first >= 0)


def _binary_copy(blocks: list[Block]) -> bytes:
    """The whole binary COPY stream of `blocks` (integer columns as int4, score as float8)."""
    out = np.empty(sum(len(b.classes) for b in blocks), _BINARY_ROW)
    out["fields"] = 4
    out["job_id_size"] = out["idx_size"] = out["class_size"] = 4
    out["score_size"] = 8
    at = 0
    for b in blocks:
        part = out[at:at + len(b.classes)]
        part["job_id"] = b.owner
        part["idx"] = np.arange(b.first, b.first + len(b.classes))
        part["predicted_class"] = b.classes
        part["score"] = b.scores
        at += len(b.classes)
    return b"".join((_BINARY_SIGNATURE, out.tobytes(), _BINARY_END))


# Rows per INSERT statement on SQLite: one statement per row spent most of a flush binding and
# stepping statements (551,000 rows/s in a bare loop); a hundred rows per statement stored
# 1,300,000 rows/s, and 1,700,000 without the top_k column where no row has top-k (its NULL
# is the column's default). 100 rows x 5 columns stays under SQLite's oldest bound of 999
# variables.
ROWS_PER_INSERT = 100
_MARK = {"qmark": "?", "format": "%s", "pyformat": "%s", "numeric": "?"}


@functools.cache
def _insert_sql(mark: str, columns: int, rows: int) -> str:
    """INSERT of `rows` predictions in one statement, of the first `columns` of COLUMNS; column
    names and placeholders are constants, every value a bound parameter."""
    row = f"({', '.join([mark] * columns)})"
    names = ", ".join(COLUMNS[:columns])
    return f"INSERT INTO predictions ({names}) VALUES {', '.join([row] * rows)}"  # noqa: S608


def count(url: str, job_id: int) -> int:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).where(Prediction.job_id == job_id)) or 0


def read(url: str, job_id: int, limit: int | None = None, offset: int = 0) -> list[PredictionRow]:
    q = (select(Prediction.idx, Prediction.predicted_class, Prediction.score, Prediction.top_k)
         .where(Prediction.job_id == job_id).order_by(Prediction.idx).offset(offset))
    if limit is not None:
        q = q.limit(limit)
    with session_scope(url) as session:
        return [{"index": i, "predicted_class": c, "score": sc, "top_k": tk}
                for i, c, sc, tk in session.execute(q)]
