"""A variant's agreement with float32 on an input's first samples, remembered by the worker.

Before a reduced-precision variant serves a job it is compared with float32 on the input's
first samples (`engines.vetted`): two forwards, about 0.8 s of a 6 s ResNet-18 job on a 2-core
CPU. The figure depends only on the variant's file, the float32 graph it is compared with, and
those samples, so it is remembered per (version, variant checksum, input as submitted, columns
read): every chunk of a chunked job checks the same first samples, and a job over an input
already checked finds the figure here. The job's own bound is still applied to it.

An input is known by its identity at submit (`InferParams.input_identity`: size, mtime and inode
of a file, the ETag of an object); one without an identity is checked every time. Kept in the
worker's memory, the most recent MOST_REMEMBERED, so a restarted worker (or another) checks
again: a check is a fixed cost, never a wrong answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

MOST_REMEMBERED = 1024  # a few hundred bytes each


@dataclass(frozen=True)
class InputSeen:
    """An input as a job was submitted with it: where, what it was then, which columns it reads."""

    input: str
    identity: str | None
    columns: tuple[str, ...] = ()

    @classmethod
    def of(cls, input_: str, identity: str | None, columns: Sequence[str] | None) -> InputSeen:
        return cls(input_, identity, tuple(columns or ()))


@dataclass(frozen=True)
class CheckedOn:
    """What a variant's figure was measured on: the version, the variant's file, the input."""

    model: str
    version: int
    variant_sha256: str
    seen: InputSeen


@dataclass(frozen=True)
class Figure:
    """A variant's agreement with float32, and on how many of the input's first samples."""

    agreement: float
    samples: int


def checked_on(model: str, version: int, variant_sha256: object, seen: InputSeen | None) -> CheckedOn | None:
    """The key a check's figure is kept under, or None when the input or the variant could not be
    told from a changed one (no identity, no checksum): then nothing is kept."""
    if seen is None or not seen.identity or not isinstance(variant_sha256, str) or not variant_sha256:
        return None
    return CheckedOn(model, version, variant_sha256, seen)


_figures: OrderedDict[CheckedOn, Figure] = OrderedDict()
_lock = threading.Lock()  # the batching lead and a job's frame may vet from two threads


def recall(key: CheckedOn | None) -> Figure | None:
    """The figure remembered for `key`, or None (never checked here, or forgotten)."""
    if key is None:
        return None
    with _lock:
        figure = _figures.get(key)
        if figure is not None:
            _figures.move_to_end(key)
        return figure


def remember(key: CheckedOn | None, figure: Figure) -> None:
    """Keep `figure` for `key`, forgetting the least recently used past MOST_REMEMBERED."""
    if key is None:
        return
    with _lock:
        _figures[key] = figure
        _figures.move_to_end(key)
        while len(_figures) > MOST_REMEMBERED:
            _figures.popitem(last=False)
