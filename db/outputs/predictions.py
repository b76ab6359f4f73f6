"""Per-sample inference results, written in bulk as blocks of samples (`blocks`) and read back
in pages of samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, and_, delete, func, insert, select, update
from sqlalchemy.orm import Session

from mxq.db.engine import get_engine, session_scope
from mxq.db.fence import Fence, RunCheck, still_ours
from mxq.db.outputs.blocks import COPY_COLUMNS, Block, Rows, as_blocks, binary_copy, decoded, prediction_rows
from mxq.db.records import PredictionRow
from mxq.db.retry import db_retry
from mxq.db.schema import Job, Prediction, utcnow

P = Prediction


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
    """Inside the caller's transaction: delete the samples of `owners` in [start, stop). A block
    across either edge is rewritten without them (a job's own edges are its blocks' edges, so
    only a clear at an index no write chose trims one)."""
    end = P.first_index + P.samples
    hit = [P.job_id.in_(owners), end > start] + ([] if stop is None else [P.first_index < stop])
    inside = [P.first_index >= start] + ([] if stop is None else [end <= stop])
    across = session.execute(select(P.job_id, P.first_index, P.classes, P.scores, P.top_k)
                             .where(*hit, ~and_(*inside))).all()
    session.execute(delete(P).where(*hit))
    kept = [part for owner, first, c, s, t in across
            for part in _outside(decoded(owner, first, c, s, t), start, stop) if len(part)]
    if kept:
        _insert(session.connection(), kept)


def _outside(block: Block, start: int, stop: int | None) -> list[Block]:
    return [block.part(block.first, start), block.part(block.stop if stop is None else stop, block.stop)]


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
    """One binary COPY on PostgreSQL, one executemany elsewhere: a row per block (`blocks`)."""
    stored = as_blocks(written)
    if not stored:
        return
    if conn.dialect.name == "postgresql":
        stream = binary_copy(stored)  # (raises before sending where a number passes its column)
        with cast(Any, conn.connection).cursor() as cur, cur.copy(
                f"COPY predictions ({', '.join(COPY_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(stream)
        return
    conn.execute(insert(P), [dict(zip(COPY_COLUMNS, b.values(), strict=True)) for b in stored])


def count(url: str, job_id: int) -> int:
    with session_scope(url) as session:
        return int(session.scalar(select(func.sum(P.samples)).where(P.job_id == job_id)) or 0)


def read(url: str, job_id: int, limit: int | None = None, offset: int = 0) -> list[PredictionRow]:
    """The job's stored samples in index order, from the `offset`th, at most `limit` of them."""
    with session_scope(url) as session:
        spans = session.execute(select(P.first_index, P.samples).where(P.job_id == job_id)
                                .order_by(P.first_index)).all()
        covering = _covering(spans, offset, limit)
        if covering is None:
            return []
        low, high, skipped = covering
        stored = session.execute(select(P.first_index, P.samples, P.classes, P.scores, P.top_k)
                                 .where(P.job_id == job_id, P.first_index >= low, P.first_index <= high)
                                 .order_by(P.first_index)).all()
    rows: list[PredictionRow] = []
    at, end = skipped, None if limit is None else offset + limit  # positions in the job's samples
    for first, samples, c, s, t in stored:
        a, b = max(0, offset - at), samples if end is None else min(samples, end - at)
        rows.extend(prediction_rows(first, c, s, t, a, b))
        at += samples
    return rows


def _covering(spans: Sequence[Any], offset: int, limit: int | None) -> tuple[int, int, int] | None:
    """The first indexes of the first and last blocks that hold samples `offset` to `offset +
    limit` (counted in index order), and how many samples come before the first of them; None
    where no block does."""
    found: tuple[int, int, int] | None = None
    at = 0
    for first, samples in spans:
        if at + samples > offset and (limit is None or at < offset + limit):
            found = (first, first, at) if found is None else (found[0], first, found[2])
        at += samples
    return found
