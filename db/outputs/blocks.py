"""A job's predictions as the `predictions` table stores them: a row per run of consecutive
samples (a `Block`), its classes and scores as packed arrays, not a row per sample.

Why: a row per sample cost PostgreSQL about 1 µs of server CPU a sample, two thirds of it the
(job, index) key's B-tree insert, and SQLite a B-tree insert a sample; the MLP's `--output db`
job stored under half its `.npy` rate on two cores. A block of a read's samples (thousands) is one
key and two byte strings: 0.04 s of server CPU per million samples.

Encoding (the `predictions` columns): `classes` int32 and `scores` float32, little-endian, one
per sample; `top_k` a JSON list with one entry per sample (its [class, probability] pairs or
kept labels, or null), NULL where no sample has one.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mxq.db.records import PredictionRow

Row = tuple[int, int, int, float, str | None]  # (job, index, class, score, top-k as JSON text)

CLASSES = np.dtype("<i4")
SCORES = np.dtype("<f4")


@dataclass(frozen=True)
class Block:
    """Job `owner`'s results for samples `first`, `first` + 1, ... as NumPy columns."""

    owner: int
    first: int
    classes: NDArray[np.integer[Any]]
    scores: NDArray[np.floating[Any]]
    top_k: Sequence[str | None] | None = None  # each sample's top-k or kept labels as JSON

    def __len__(self) -> int:
        return len(self.classes)

    @property
    def stop(self) -> int:
        return self.first + len(self.classes)

    def rows(self) -> list[Row]:
        """The block as one tuple per sample."""
        top = [None] * len(self) if self.top_k is None else self.top_k
        return list(zip([self.owner] * len(self), range(self.first, self.stop), self.classes.tolist(),
                        self.scores.tolist(), top, strict=True))

    def values(self) -> tuple[int, int, int, bytes, bytes, str | None]:
        """The block's `predictions` row: (job_id, first_index, samples, classes, scores, top_k)."""
        top = None
        if self.top_k is not None and any(t is not None for t in self.top_k):
            top = "[" + ",".join("null" if t is None else t for t in self.top_k) + "]"
        return (self.owner, self.first, len(self), self.classes.astype(CLASSES).tobytes(),
                self.scores.astype(SCORES).tobytes(), top)

    def part(self, start: int, stop: int) -> Block:
        """The samples of [start, stop) (clipped to the block's own)."""
        a, b = max(start, self.first) - self.first, min(stop, self.stop) - self.first
        top = None if self.top_k is None else self.top_k[a:b]
        return Block(self.owner, self.first + a, self.classes[a:b], self.scores[a:b], top)


Rows = Sequence[Row | Block]
"""What one write stores: rows, or blocks of them."""


def decoded(owner: int, first: int, classes: bytes, scores: bytes, top_k: str | None) -> Block:
    """A stored `predictions` row back as a block."""
    top = None if top_k is None else [None if t is None else json.dumps(t) for t in json.loads(top_k)]
    return Block(owner, first, np.frombuffer(classes, CLASSES), np.frombuffer(scores, SCORES), top)


def as_blocks(written: Rows) -> list[Block]:
    """Blocks as they are; tuples grouped into blocks of consecutive samples of one job (a
    merged batch's rows)."""
    out: list[Block] = []
    for is_block, group in groupby(written, key=lambda r: isinstance(r, Block)):
        if is_block:
            out.extend(b for b in group if isinstance(b, Block) and len(b))
        else:
            out.extend(_runs([r for r in group if not isinstance(r, Block)]))
    return out


def _runs(rows: list[Row]) -> Iterator[Block]:
    """Tuples as blocks, one per run of consecutive indexes of one job."""
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][0] != rows[i - 1][0] or rows[i][1] != rows[i - 1][1] + 1:
            run = rows[start:i]
            yield Block(run[0][0], run[0][1], np.array([r[2] for r in run], CLASSES),
                        np.array([r[3] for r in run], SCORES), [r[4] for r in run])
            start = i


def prediction_rows(first: int, classes: bytes, scores: bytes, top_k: str | None, a: int,
                    b: int) -> Iterable[PredictionRow]:
    """The `a`th to `b`th samples (end excluded) of a stored block from sample `first`, as
    `predictions.read` returns them."""
    top: Iterable[Any] = [None] * (b - a) if top_k is None else json.loads(top_k)[a:b]
    cs = np.frombuffer(classes, CLASSES)[a:b].tolist()
    ss = np.frombuffer(scores, SCORES)[a:b].tolist()
    for i, c, s, t in zip(range(first + a, first + b), cs, ss, top, strict=True):
        yield {"index": i, "predicted_class": c, "score": s, "top_k": t}


# PostgreSQL's binary COPY: its signature, flags and header extension length; then per row its
# field count and each field's length and value, in network order (-1 for NULL); then -1 as the
# end (www.postgresql.org/docs/current/sql-copy.html). Columns: job_id int4, first_index int8,
# samples int4, classes bytea, scores bytea, top_k text.
COPY_COLUMNS = ("job_id", "first_index", "samples", "classes", "scores", "top_k")
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_END = b"\xff\xff"
_HEAD = struct.Struct(">hiiiqii")


def binary_copy(blocks: Iterable[Block]) -> bytes:
    """The whole binary COPY stream of `blocks`' rows. An owner or index past its column's range
    raises struct.error here, before anything is sent."""
    parts = [_SIGNATURE]
    for b in blocks:
        owner, first, samples, classes, scores, top = b.values()
        parts += [_HEAD.pack(6, 4, owner, 8, first, 4, samples), struct.pack(">i", len(classes)), classes,
                  struct.pack(">i", len(scores)), scores]
        text = None if top is None else top.encode()
        parts += [struct.pack(">i", -1)] if text is None else [struct.pack(">i", len(text)), text]
    parts.append(_END)
    return b"".join(parts)
