"""Where an inference job's predictions go, and how a later attempt resumes after the last
stored sample.

Each output kind is kept so that what SQL calls committed is really stored:
- `db`: the rows of a flush and the job's committed position in one transaction;
- `npy`: the probabilities written into `job-ID.npy` at their offsets, synced to disk before
  the position moves;
- `parquet`: each flush a part file, on disk (or a part object in a bucket, `--output-to`)
  before the position moves, merged into `job-ID.parquet` at the end (`part_stores`); an `npy`
  output in a bucket is kept in parts the same way and merged into `job-ID.npy`.
A killed attempt loses at most what it computed since its last commit; the next one starts there.
An attempt that is no longer its job's (paused, then handed on) stops at its next write: its
commit is refused by its fence, and the part it wrote under its own name is removed. A job
succeeds only once its output is verified: the merged file there with every row, or the npy
whole; else it fails saying what is missing.

Files live under `$MXQ_HOME/outputs/<stack id>/` (`mxq.db.stack`): a home reused with another
database starts in an empty folder, never meeting the old one's `job-ID` files.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TypeVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from mxq.db import events
from mxq.db.chunks import chunk_statuses
from mxq.db.fence import Fence, RunCheck
from mxq.db.jobs import record_metric
from mxq.db.outputs import parquet, predictions
from mxq.db.outputs.blocks import Block
from mxq.db.outputs.predictions import Ranked
from mxq.db.outputs.results import output_file
from mxq.db.records import CLASSIFIER_OUTPUTS, Head
from mxq.db.stack import stack_id
from mxq.objects import job_output
from mxq.status import JobStatus
from mxq.tasks.inference.inputs.npy import parse_header
from mxq.tasks.inference.part_stores import BucketParts, LocalParts, PartStore, probability_part
from mxq.tasks.inference.pipeline import at_idle_priority
from mxq.tasks.job_context import JobContext, JobFailed, JobLost
from mxq.tasks.model_store import output_kinds
from mxq.workers.jobs.jobspecs import InferParams
from mxq.workers.settings import Settings
from mxq.workers.storage.client import ObjectTaken

T = TypeVar("T")
P = ParamSpec("P")


def output_path(settings: Settings, job_id: int, suffix: str = ".npy") -> Path:
    """Where a job's output file lies in this home (under its stack's id)."""
    return output_file(settings.home_path, stack_id(settings.database), job_id, suffix)


@dataclass(frozen=True)
class NpyOutput:
    """The job's probabilities in its `.npy` file, (samples, classes) float32: created once, every
    block allocated; each flush writes its results at their offsets (pwrite) and makes them
    durable (fdatasync), on the writer thread. Written through a shared mapping instead, the
    compute thread took a page fault with the filesystem's bookkeeping for each new page, and
    each writeback write-protected pages under it (a TLB flush on every core): a small model's
    job ran at 0.75-0.84 of its loop with results mapped, 0.89-0.90 written so."""

    path: Path
    classes: int
    data_offset: int  # where the values begin, after the header
    columns: slice = field(default_factory=lambda: slice(None))  # of a job's rows: one output's,
    # of a model with several

    def write(self, parts: list[tuple[int, NDArray[np.float32]]]) -> None:
        """Write each (first sample, probabilities) in place, then fdatasync."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            for first, probs in parts:
                data = np.ascontiguousarray(probs[:, self.columns], dtype=np.float32).data.cast("B")
                at = self.data_offset + first * self.classes * 4
                while data:  # a regular file's pwrite is whole unless the disk filled up
                    done = os.pwrite(fd, data, at)
                    data, at = data[done:], at + done
            os.fdatasync(fd)
        finally:
            os.close(fd)


def _output_npy(settings: Settings, job_id: int, rows: int, classes: int, suffix: str = ".npy",
                columns: slice = slice(None)) -> NpyOutput:
    """The job's output file (`job-ID.npy`, or one output's `job-ID.NAME.npy`), created once
    (under a lock: chunks share it); JobFailed when an existing one is not the (rows, classes)
    float32 array this job writes."""
    path = output_path(settings, job_id, suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        created = not path.exists()
        if created:
            np.lib.format.open_memmap(  # type: ignore[no-untyped-call]  # untyped in NumPy 1.23's stubs
                path, mode="w+", dtype=np.float32, shape=(rows, classes)).flush()
        _reserve(path, created)
    return NpyOutput(path, classes, _npy_layout(path, rows, classes), columns)


def _npy_layout(path: Path, rows: int, classes: int) -> int:
    """Where the values of the .npy output at `path` begin; JobFailed when it cannot be read or
    is not the (rows, classes) float32 array the job writes. Checked when the job opens it and
    again once every flush is stored (the file may have gone or been replaced meanwhile)."""
    try:
        with path.open("rb") as f:
            shape, fortran, dtype = parse_header(f)
            offset = f.tell()
    except (OSError, ValueError, TypeError, SyntaxError) as exc:  # NumPy's reader raises the last three
        raise JobFailed(f"output {path} cannot be read: {exc}") from None
    if shape != (rows, classes) or fortran or dtype != np.dtype("<f4"):
        raise JobFailed(f"output {path} holds a {dtype} array of shape {shape}, not the float32 "
                        f"({rows}, {classes}) this job writes")
    return offset


def _reserve(path: Path, created: bool) -> None:
    """Allocate every block of the output now (posix_fallocate): a full disk is this job's
    error at its start, naming the disk, not a failed write after hours of compute. A file this
    call created is removed again; a filesystem that cannot allocate ahead is left as before."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return
        if created:
            path.unlink(missing_ok=True)
        raise JobFailed(f"no space left on {_mount_point(path)} for {path.name} ({size} bytes)") from None
    finally:
        os.close(fd)


def _mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding `path`: the device a full disk names."""
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def block(owner: int, first: int, probs: NDArray[np.float32], top_k: int,
          labels: list[list[tuple[int, float]]] | None = None) -> Block:
    """Prediction rows of one batch as columns, ranked with vectorized NumPy; with `labels` (a
    multi-label model's kept labels), those in place of top-k."""
    r = Ranked.of(probs, top_k if labels is None else 0)
    top: list[str] | None = None
    if labels is not None:
        top = [json.dumps(kept) for kept in labels]
    elif r.order is not None and r.best is not None:
        top = [json.dumps(list(zip(o, b, strict=True)))
               for o, b in zip(r.order.tolist(), r.best.tolist(), strict=True)]
    return Block(owner, first, r.classes, r.scores, top)


@dataclass
class Flush:
    """What one flush stores: results up to sample `last`, and its throughput point."""

    rows: list[Block]
    tables: list[pa.Table]
    probs: list[tuple[int, NDArray[np.float32]]]  # (first sample, probabilities) for the .npy
    step: int
    samples: int
    seconds: float
    last: int


@dataclass
class JobOutputs:
    """The outputs of one job (or chunk) over [start, stop) of an input of `count` samples."""

    job: JobContext
    p: InferParams
    owner: int  # the job the predictions belong to: a chunk's parent, else the job
    count: int
    classes: int
    start: int
    stop: int
    kind: str = "logits"  # what the model outputs (mxq.db.records.OUTPUT_KINDS, or HEADS)
    heads: list[Head] | None = None  # a model's several outputs, side by side in each row
    npys: list[NpyOutput] = field(default_factory=list, init=False)  # npy, both: one per output
    parts: PartStore | None = field(default=None, init=False)  # parquet (disk or bucket), npy in a bucket
    rows_wanted: bool = field(default=False, init=False)  # db, both
    _rows: list[Block] = field(default_factory=list, init=False)
    _tables: list[pa.Table] = field(default_factory=list, init=False)
    _probs: list[tuple[int, NDArray[np.float32]]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        """Decided once per job, not per batch: which outputs this job keeps."""
        if self.p.output_to is not None:  # parquet or npy, kept in a bucket
            self.parts = _bucket_parts(self.job.settings, self.p.output_to, self.owner,
                                       self.classes if self.p.output == "npy" else None)
        elif self.p.output in ("npy", "both") and self.heads:
            self.npys = [_output_npy(self.job.settings, self.owner, self.count, head["width"],
                                     f".{head['name']}.npy", span)
                         for head, span in output_kinds.columns(self.heads)]
        elif self.p.output in ("npy", "both"):
            self.npys = [_output_npy(self.job.settings, self.owner, self.count, self.classes)]
        elif self.p.output == "parquet":
            self.parts = LocalParts(output_path(self.job.settings, self.owner, ".parquet"))
        self.rows_wanted = self.p.output in ("db", "both")

    @property
    def holds_results(self) -> bool:
        """Whether a flush's results wait in memory as SQL rows or Parquet tables (the .npy's wait
        as arrays, a tenth of their size or less)."""
        return self.rows_wanted or self.parts is not None

    @property
    def shown(self) -> str:
        """What the job's result names as its output."""
        if self.parts is not None:
            return self.parts.shown
        return str(self.npys[0].path) if self.npys else "db"

    @property
    def files(self) -> dict[str, str] | None:
        """Each output's file, by name, for a model with several outputs written as .npy."""
        if not self.heads or not self.npys:
            return None
        return {head["name"]: str(npy.path) for head, npy in zip(self.heads, self.npys, strict=True)}

    def resume(self) -> int:
        """The first sample this attempt computes: right after the last one an earlier attempt
        committed (recorded as a `resumed` event), else `start`. What lies beyond it is cleared,
        only while this attempt holds the job (JobLost otherwise)."""
        done = self.job.committed
        begin = done if done is not None and self.start < done <= self.stop else self.start
        fence = self.job.fence
        assert fence is not None  # outputs exist only for a claimed attempt
        if not predictions.replace_range(self.job.url, fence, self.owner, begin, self.stop):
            raise self._lost(fence)  # a successor's rows and parts are its own
        if self.parts is not None:
            self.parts.drop_parts(begin, self.stop)
        if begin > self.start:
            events.record(self.job.url, self.job.id, events.RESUMED,
                          f"resumed at sample {begin}: an earlier attempt stored "
                          f"[{self.start}, {begin}) of [{self.start}, {self.stop})",
                          position=begin, start=self.start, stop=self.stop)
        return begin

    def add(self, first: int, probs: NDArray[np.float32]) -> None:
        """One read's results, held until the next flush writes them."""
        if self.npys:
            self._probs.append((first, probs))
        labels = (predictions.kept_labels(probs, self.p.threshold, self.p.top_k)
                  if self.kind == "multilabel" and (self.rows_wanted or self.parts is not None) else None)
        if self.rows_wanted:
            self._rows.append(block(self.owner, first, probs, self.p.top_k, labels))
        if self.parts is not None:
            self._tables.append(self._table(first, probs, labels))

    def _table(self, first: int, probs: NDArray[np.float32],
               labels: list[list[tuple[int, float]]] | None) -> pa.Table:
        """One read's results as a part's table: the npy's values, or Parquet's columns."""
        if self.p.output == "npy":
            return probability_part(first, probs)
        if self.heads:
            return parquet.from_heads(first, probs, self.heads, self.p.top_k, self.p.threshold)
        if self.kind in CLASSIFIER_OUTPUTS:
            return parquet.from_probabilities(first, probs, self.p.top_k)
        return parquet.from_values(first, probs, self.kind, labels)

    def take(self, step: int, samples: int, seconds: float, last: int) -> Flush:
        flush = Flush(self._rows, self._tables, self._probs, step, samples, seconds, last)
        self._rows, self._tables, self._probs = [], [], []
        return flush

    def store(self, flush: Flush) -> None:
        """Make the flush durable, then commit its position with its rows (on the writer thread;
        on a CPU device its files are written at idle priority: `pipeline.at_idle_priority`)."""
        fence = self.job.fence
        assert fence is not None  # outputs exist only for a claimed attempt
        if self.npys and flush.probs:
            self.job.check_owned()  # a pause (in the forward pass, say) ends here, before the write
            for npy in self.npys:
                self._files(npy.write, flush.probs)
        part = None
        if self.parts is not None and flush.tables:
            with _only_own():
                part = self._files(self.parts.write_part, flush.tables, fence.tag)
        verdict = predictions.commit(self.job.url, fence, flush.rows, flush.last)
        if verdict is RunCheck.LOST:
            if part is not None and self.parts is not None:
                self.parts.remove_part(part)
            raise self._lost(fence)
        self.job.heard(verdict)  # a preemption asked is seen at the next batch, not 2 s later
        if not record_metric(self.job.url, fence, flush.step, self.job.device, flush.samples,
                             flush.seconds):
            raise self._lost(fence)
        self.job.progress((flush.last - self.start) / (self.stop - self.start))

    def _files(self, write: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`write(*args)`, a write of the output's files: on a CPU device at idle priority."""
        if self.job.parsed_device.kind == "cpu":
            return at_idle_priority(write, *args, **kwargs)
        return write(*args, **kwargs)

    def _lost(self, fence: Fence) -> JobLost:
        return JobLost(f"job {self.job.id} now belongs to another attempt (this one, "
                       f"{fence.attempt}, was taken for dead)")

    def finish(self) -> None:
        """Once every flush is stored (each made its writes durable): the Parquet parts merged
        when complete; JobFailed when the output cannot be verified (a part or the file went
        missing)."""
        for npy in self.npys:
            _npy_layout(npy.path, self.count, npy.classes)
        if self.parts is not None:
            with _only_own():
                self._finish_parts(self.parts)

    def _finish_parts(self, parts: PartStore) -> None:
        if not parts.covers(self.start, self.stop):
            raise JobFailed(_incomplete(parts, self.count, " (a part file was removed while the job "
                                                           "ran)"))
        merged = parts.merge_if_complete(self.count)
        if not merged and (self.job.parent_id is None or self._siblings_done()):
            raise JobFailed(_incomplete(parts, self.count))
        if merged and (rows := parts.rows_in()) != self.count:
            raise JobFailed(f"output {parts.shown} holds {rows} rows, not {self.count}")

    def _siblings_done(self) -> bool:
        """Every other chunk of the parent succeeded: this one was the last to merge."""
        assert self.job.parent_id is not None
        others = chunk_statuses(self.job.url, self.job.parent_id, but=self.job.id)
        return all(s == JobStatus.SUCCEEDED for s in others)

    def abandon(self) -> None:
        """The job failed: its Parquet parts are removed (they will never be merged)."""
        if self.parts is not None and self.job.parent_id is None:
            self.parts.remove_all()


@contextmanager
def _only_own() -> Iterator[None]:
    """Another writer's object at one of the job's keys (a write refused, a part not the job's)
    fails the job in one line naming it."""
    try:
        yield
    except ObjectTaken as exc:
        raise JobFailed(f"output {exc}") from None


def _bucket_parts(settings: Settings, output_to: str, owner: int,
                  classes: int | None) -> BucketParts:
    """The job's parts and merged object in a bucket: `.parquet`, or with `classes` an `.npy`
    of probabilities."""
    final = job_output(output_to, stack_id(settings.database), owner,
                       ".parquet" if classes is None else ".npy")
    return BucketParts(settings, final, settings.home_path / "tmp", classes)


def _incomplete(parts: PartStore, count: int, why: str = "") -> str:
    return (f"output incomplete: the parts of {parts.shown.rsplit('/', 1)[-1]} lack "
            f"{parts.missing(count)}{why}")
