"""A multi-node training's epochs, merged from its parts' (each part records its own node's).

Pure: `mxq.db.outputs.epochs.merge_parts` reads the parts' rows and stores what these return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypedDict

from mxq.json_types import JsonObject, JsonValue


class EpochFigures(Protocol):
    """One part's record of one epoch (`mxq.db.schema.Epoch` is one)."""

    @property
    def train_loss(self) -> float: ...
    @property
    def train_accuracy(self) -> float: ...
    @property
    def val_accuracy(self) -> float | None: ...
    @property
    def seconds(self) -> float: ...
    @property
    def samples_per_sec(self) -> float: ...
    @property
    def per_device(self) -> Mapping[str, JsonValue] | None: ...
    @property
    def checkpoint(self) -> str | None: ...


class MergedEpoch(TypedDict):
    """One epoch of the whole training, as its parent's row stores it (`merge`)."""

    epoch: int
    train_loss: float
    train_accuracy: float
    val_accuracy: float | None
    seconds: float
    samples_per_sec: float
    per_device: JsonObject
    checkpoint: str | None


def ready(by_epoch: Mapping[int, Sequence[EpochFigures]], parts: int, merged: set[int]) -> list[int]:
    """The epochs every part has finished and that are not merged yet, in order: an epoch some
    part has not finished waits for a later merge."""
    return sorted(n for n, rows in by_epoch.items() if len(rows) == parts and n not in merged)


def merge(epoch: int, rows: Sequence[EpochFigures]) -> MergedEpoch:
    """The mean loss and accuracy, the slowest node's seconds, samples/s summed, every node's
    devices in `per_device` (labelled `cpu:0@node`), the first checkpoint any part names."""
    vals = [r.val_accuracy for r in rows if r.val_accuracy is not None]
    return {"epoch": epoch,
            "train_loss": _mean([r.train_loss for r in rows]),
            "train_accuracy": _mean([r.train_accuracy for r in rows]),
            "val_accuracy": _mean(vals) if vals else None,
            "seconds": max(r.seconds for r in rows),
            "samples_per_sec": sum(r.samples_per_sec for r in rows),
            "per_device": _per_device(rows),
            "checkpoint": next((r.checkpoint for r in rows if r.checkpoint), None)}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _per_device(rows: Sequence[EpochFigures]) -> JsonObject:
    """Every node's devices' figures in one object (each device already labelled with its node)."""
    return {k: v for r in rows for k, v in (r.per_device or {}).items()}
