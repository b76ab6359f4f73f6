"""How a job made of parts ends: the chunks of a chunked inference, or the nodes of a
multi-node training. Once every part has finished, the parent's status, error and figures
follow from the parts' alone; a multi-node training's epochs are merged from its parts' as they
finish (each part records its own node's).

Pure: `mxq.db.chunks.settle_parent` reads the parts and stores what `settle` returns, and
`mxq.db.outputs.epochs.merge_parts` the merged epochs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypedDict

from mxq.json_types import JsonObject, JsonValue
from mxq.status import JobStatus

# A part of a multi-node training that stopped because another part failed says so first (its
# error starts with this): the parent's error names the part that failed first of its own accord.
KNOCK_ON = "stopped because "
# What a multi-node training's result keeps of its rank-0 part's.
RANK0_KEYS = ("model", "model_version", "promotion", "val_accuracy", "train_accuracy", "train_loss",
              "epochs", "resumed_from_epoch")


class Part(Protocol):
    """One finished part (`mxq.db.schema.Job` is one). A datetime without a zone is UTC."""

    @property
    def id(self) -> int: ...
    @property
    def chunk_index(self) -> int | None: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def node(self) -> str | None: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def result(self) -> dict[str, Any] | None: ...
    @property
    def samples(self) -> int | None: ...
    @property
    def seconds(self) -> float | None: ...
    @property
    def samples_per_sec(self) -> float | None: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def finished_at(self) -> datetime | None: ...


def knock_on(reason: str) -> str:
    """The error of a part that stopped because of another part."""
    return f"{KNOCK_ON}{reason}"


def first_cause(failed: Sequence[Part], now: datetime) -> Part:
    """The part that failed first of its own accord (knock-on failures last)."""
    return min(failed, key=lambda c: (c.error is None or c.error.startswith(KNOCK_ON),
                                      _utc(c.finished_at or now), c.chunk_index or 0))


def settle(kind: str, parts: Sequence[Part], now: datetime) -> dict[str, Any]:
    """The parent's column values once every part has finished: samples over the wall-clock
    span of the parts, and the outcome; a multi-node training (`kind` "train") also gets its
    figures per node and summed (`train_summary`)."""
    values: dict[str, Any] = dict(finished_at=now, heartbeat_at=None, **_throughput(parts, now))
    failed = [p for p in parts if p.status != JobStatus.SUCCEEDED]
    if any(p.status == JobStatus.CANCELLED for p in parts):
        values.update(status=JobStatus.CANCELLED, error="cancelled; finished chunks kept")
    elif failed:
        values.update(status=JobStatus.FAILED, error=_failure(kind, failed, now))
    else:
        values.update(status=JobStatus.SUCCEEDED, progress=1.0)
        if kind == "train":
            values.update(train_summary(parts))
        elif (output := shared_output(parts)) is not None:
            files = (parts[0].result or {}).get("output_files")  # a model's several outputs'
            values.update(result={"output": output, "chunks": len(parts),
                                  **({"output_files": files} if files else {}),
                                  **{key: said for key in LINEAGE
                                     if (said := _agreed(parts, key)) is not None}})
    return values


# What produced a chunked inference's output, as its chunks' results say it (its lineage).
LINEAGE = ("engine", "precision", "mxq_version")


def _agreed(parts: Sequence[Part], key: str) -> str | None:
    """What every part's result says under `key`; the values, comma-separated, where parts
    differ (chunks on two kinds of device may have run two engines)."""
    said = sorted({str(v) for p in parts if (v := (p.result or {}).get(key)) is not None})
    return ",".join(said) or None


def shared_output(parts: Sequence[Part]) -> str | None:
    """The one output every chunk of an inference wrote into (its parent's file, object or
    `db`): what the parent's record names, as a job that did not split does."""
    outputs = {(p.result or {}).get("output") for p in parts}
    found = outputs.pop() if len(outputs) == 1 else None
    return found if isinstance(found, str) else None


def _throughput(parts: Sequence[Part], now: datetime) -> dict[str, Any]:
    """Samples over the wall-clock span from the first part's start to the last one's end."""
    samples = sum(p.samples or 0 for p in parts)
    starts = [_utc(p.started_at) for p in parts if p.started_at is not None]
    begin = min(starts) if samples and starts else None
    end = max([_utc(p.finished_at) for p in parts if p.finished_at is not None], default=now)
    seconds = (end - begin).total_seconds() if begin else None
    return {"samples": samples, "seconds": seconds,
            "samples_per_sec": samples / seconds if seconds else None}


def _utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _failure(kind: str, failed: Sequence[Part], now: datetime) -> str:
    if kind != "train":
        first = failed[0]
        return f"chunk {first.chunk_index} (job {first.id}) {first.status}: {first.error}"
    first = first_cause(failed, now)
    node = (first.params.get("dist") or {}).get("node", first.node)
    return f"part {first.chunk_index} on node {node} (job {first.id}) {first.status}: {first.error}"


def train_summary(parts: Sequence[Part]) -> dict[str, Any]:
    """A multi-node training's figures: per node, and summed over nodes (samples/s)."""
    results = [p.result or {} for p in parts]
    rank0 = next((r for r in results if r.get("rank") == 0), results[0])
    rate, seconds = _summed_rate(parts), _slowest(parts)
    devices = _devices(results)
    result = {**{k: rank0.get(k) for k in RANK0_KEYS}, "nodes": len(parts), "devices": devices,
              "samples_per_sec": rate, "per_node": _per_node(parts, results)}
    return dict(samples=sum(p.samples or 0 for p in parts), seconds=seconds or None,
                samples_per_sec=rate or None, result=result, devices=devices)


def _devices(results: list[dict[str, Any]]) -> list[str]:
    """Every node's devices, as each part's result labels them (`cpu:0@node`)."""
    return [d for r in results for d in (r.get("per_device") or {})]


def _summed_rate(parts: Sequence[Part]) -> float:
    """Samples/s over every node: the nodes train side by side."""
    return sum(p.samples_per_sec or 0.0 for p in parts)


def _slowest(parts: Sequence[Part]) -> float:
    """The seconds of the slowest node: the training's own."""
    return max((p.seconds or 0.0 for p in parts), default=0.0)


def _per_node(parts: Sequence[Part], results: list[dict[str, Any]]) -> dict[str | None, dict[str, Any]]:
    return {p.node: _node_figures(p, r) for p, r in zip(parts, results, strict=True)}


def _node_figures(part: Part, result: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": part.id, "part": part.chunk_index, "rank": result.get("rank"),
            "devices": result.get("devices"), "samples": part.samples, "seconds": part.seconds,
            "samples_per_sec": part.samples_per_sec, "per_device": result.get("per_device")}


# A multi-node training's epochs


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
    """One epoch of the whole training, as its parent's row stores it (`merge_epochs`)."""

    epoch: int
    train_loss: float
    train_accuracy: float
    val_accuracy: float | None
    seconds: float
    samples_per_sec: float
    per_device: JsonObject
    checkpoint: str | None


def epochs_ready(by_epoch: Mapping[int, Sequence[EpochFigures]], parts: int, merged: set[int]) -> list[int]:
    """The epochs every part has finished and that are not merged yet, in order: an epoch some
    part has not finished waits for a later merge."""
    return sorted(n for n, rows in by_epoch.items() if len(rows) == parts and n not in merged)


def merge_epochs(epoch: int, rows: Sequence[EpochFigures]) -> MergedEpoch:
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
