"""`infer`: stream an input through a model on the worker's device; store every prediction.

The input is read a few MiB at a time on a side thread (`read_size`: whole batches) and computed
in batches of a fixed shape (the last one may be short); results are stored (`tasks/inference/outputs.py`:
SQL rows, an .npy or Parquet) at most every FLUSH_SECONDS or `flush_rows` samples, each flush
committing the job's position with its results, a throughput point and the progress; a later
attempt of a killed job resumes after the last committed sample.
A batch that runs out of device memory is split (`batch_fit`): the batch size is halved (down to
MIN_BATCH_SIZE) and kept for the rest of the job; each halving is recorded as a job event.

Every score stored is finite, on every engine and output kind: a sample whose input (after
preprocessing) holds NaN or an infinity fails the job, naming it, before any engine sees it (what
an engine answers for one differs: MXNet's CPU ReLU turns NaN into 0, ONNX Runtime's keeps it),
and so does a sample whose model output is not finite (`engines.NonFiniteOutput`). In a merged
batch only the job holding that sample fails.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import math
import time
from collections.abc import Callable, Iterator

import numpy as np
from numpy.typing import NDArray

from mxq.db import jobs, registry
from mxq.db.batches import finish_batch
from mxq.db.records import CLASSIFIER_OUTPUTS, ModelRecord
from mxq.db.retry import db_retry
from mxq.errors import device_fault
from mxq.tasks.inference import batching, engines, verdicts
from mxq.tasks.inference.batch_fit import BatchFit
from mxq.tasks.inference.inputs import InputError, InputSource
from mxq.tasks.inference.outputs import JobOutputs, block
from mxq.tasks.inference.pipeline import BackgroundWriter, prefetch
from mxq.tasks.inference.submitted_input import open_submitted, unchanged
from mxq.tasks.job_context import (
    FanOut,
    JobCancelled,
    JobContext,
    JobInputError,
    JobLost,
    JobPreempted,
    JobTimedOut,
    Outcome,
)
from mxq.tasks.runner import job_task
from mxq.tasks.runtimes.oom import OutOfMemory
from mxq.workers.jobs.jobspecs import AUTO_BATCH_START, InferParams
from mxq.workers.storage.client import StorageError

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # how often results are written and progress reported
FLUSH_ROWS = 20000  # ... or after this many samples, whichever comes first
FLUSH_BYTES = 32 << 20  # ... or, where only the .npy takes them, this much of it (flush_rows)
READ_BYTES = 4 << 20  # the prefetch thread reads at most about this much at once (`read_size`) ...
READ_SECONDS = 0.05  # ... and at most this much compute, as the last batch took
READ_OOM_SECONDS = 10.0  # a read that runs out of host memory is tried again this long ...
READ_RETRY_SECONDS = 0.05  # ... this often (`_read`)


def flush_rows(held: bool, classes: int, samples: int) -> int:
    """The most samples a flush of a job of `samples` holds: FLUSH_ROWS where its results wait in
    memory until the flush as SQL rows or Parquet tables (`held`); where only the .npy takes
    them (as arrays, 4 bytes a class), up to FLUSH_BYTES of it but at most a tenth of the job
    (so its progress moves and a kill loses little), never fewer. A small model computes a
    million samples a second: a flush every 20,000 committed 50 times a second, and the MLP's
    job ran at 0.47 of a bare loop; with 200,000 (8 MiB), at 0.83 (bench engines), still 4
    commits a second; with 32 MiB FLUSH_SECONDS sets the pace: 4 % less CPU per sample (2.57 ->
    2.47 CPU-s a million, medians of 4 alternated 3 M-sample jobs)."""
    if held:
        return FLUSH_ROWS
    return max(FLUSH_ROWS, min(FLUSH_BYTES // (4 * classes), samples // 10))


def _chunks(p: InferParams, count: int) -> list[InferParams]:
    """The job's chunks: its request over [start, stop) each (a chunk splits no further)."""
    size = p.chunk_size or count
    return [p.model_copy(update={"chunk_size": None, "start": a, "stop": min(a + size, count)})
            for a in range(0, count, size)]


@job_task("infer")
def infer(job: JobContext) -> Outcome | FanOut:
    p = job.params(InferParams)
    model = _model(job, p)
    source = open_submitted(job.settings, p, model)
    if job.parent_id is None and p.chunk_size and source.count > p.chunk_size:
        return FanOut(_chunks(p, source.count))
    if job.parent_id is None and batching.mergeable(p, source.count, job.settings) \
            and model["outputs"] in CLASSIFIER_OUTPUTS:  # a merged batch's rows rank classes
        return _merged(job, p, model, source)
    return _ranged(job, p, model, source)


# A job's reads ride out a short database outage as its writes do (mxq.db.retry): a job that
# started during one failed at its model's lookup (tests/faults/test_outages.py, once in CI).
_resolve = db_retry(registry.resolve)
_earlier_seconds = db_retry(jobs.earlier_seconds)
_next_metric_step = db_retry(jobs.next_metric_step)


def _model(job: JobContext, p: InferParams) -> ModelRecord:
    """The version the job asks for, once its --top-k fits it (JobInputError otherwise)."""
    try:
        model = _resolve(job.url, p.model, p.model_version)
    except LookupError as exc:
        raise JobInputError(str(exc)) from None
    if p.top_k > (most := _top_k_bound(model)):
        raise JobInputError(f"top-k {p.top_k} exceeds the {most} classes of "
                            f"{model['name']}:{model['version']}")
    return model


def _ranged(job: JobContext, p: InferParams, model: ModelRecord, source: InputSource) -> Outcome:
    """The job's samples (all of the input's, or its chunk's), streamed batch by batch into its
    outputs from where earlier attempts stopped."""
    start, stop = p.start or 0, p.stop or source.count
    if stop > source.count:
        raise JobInputError(f"chunk [{start}, {stop}) lies beyond the {source.count} samples of "
                            f"{p.input}")
    fit = BatchFit(job, _start_batch(p, stop - start, job.settings.max_batch_size))
    costs, since = job.costs, time.perf_counter()
    engine = _engine(job, p, model, source, fit.size)
    costs.engine_ready(since, engine.check.seconds if engine.check else 0.0)
    _announce(job, model, engine, f"samples {start}..{stop} of {source.count}, batch {fit.size}")
    owner = job.parent_id or job.id  # predictions of chunks belong to their parent job
    out = JobOutputs(job, p, owner, source.count, model["classes"], start, stop,
                     model.get("outputs") or "logits", model.get("heads"))
    begin = out.resume()
    earlier = _earlier_seconds(job.url, job.id) if begin > start else 0.0
    began = time.perf_counter()
    _stream_all(job, p, source, engine, out, begin, fit)
    # Every sample the output holds, over the compute time of every attempt that stored them.
    seconds = earlier + time.perf_counter() - began
    log.info("job %s: %s samples stored (%s)", job.id, stop - start, out.shown)
    return Outcome(samples=stop - start, seconds=seconds, result={
        **_ran(model, engine, source, (start, stop), begin), "batch_size": p.batch_size,
        "batch_size_used": fit.size, "output": out.shown, "classes": model["classes"],
        "fixed_costs": costs.reported(), "mxq_version": mxq_version(),
        **({"output_files": out.files} if out.files else {}),
    })


def _engine(job: JobContext, p: InferParams, model: ModelRecord, source: InputSource,
            batch: int) -> engines.Engine:
    """The engine the job runs on, a reduced precision's vetted on the input's first samples."""
    engine = engines.pick(job, model, p.engine, batch, _precision(p))
    if engine.precision == "fp32":
        return engine
    # every chunk checks the same samples, and decides alike
    return engines.vetted(job, model, engine,
                          lambda: _read(p, source, 0, source.count, lambda _: engines.CHECK_SAMPLES),
                          p.engine, _precision(p), _seen(p, source))


def _seen(p: InferParams, source: InputSource) -> verdicts.InputSeen:
    """The job's input as submitted: what a variant's check of its first samples is kept under."""
    return verdicts.InputSeen.of(str(source.path), p.input_identity, p.columns)


def _stream_all(job: JobContext, p: InferParams, source: InputSource, engine: engines.Engine,
                out: JobOutputs, begin: int, fit: BatchFit) -> None:
    """Stream the samples from `begin` into `out` and finish it; what it stored is dropped on a
    failure, unless the job stopped in a way that keeps it."""
    try:
        _stream(job, p, source, engine, out, begin, fit)
        out.finish()
        job.costs.finished()
    except Exception as exc:
        # another's; kept (cancelled, or past its time limit); or resumed
        if not isinstance(exc, JobLost | JobCancelled | JobTimedOut | JobPreempted):
            out.abandon()
        raise


def _ran(model: ModelRecord, engine: engines.Engine, source: InputSource, span: tuple[int, int],
         begin: int) -> dict[str, object]:
    """What a job's result says of what it ran: the version, the engine, the input and range."""
    start, stop = span
    return {"model": model["name"], "model_version": model["version"],
            "model_cache": "hit" if engine.cached else "miss", **_engine_fields(engine),
            "input": str(source.path), "range": [start, stop],
            "resumed_from": begin if begin > start else None}


@functools.cache
def mxq_version() -> str:
    """The installed mxq's version, which a job's lineage records (`prediction_lineage`)."""
    return importlib.metadata.version("mxq")


def _top_k_bound(model: ModelRecord) -> int:
    """The most classes --top-k may ask: the version's, or its narrowest classifier or
    multi-label output's (of several)."""
    widths = [h["width"] for h in model.get("heads") or []
              if h["kind"] in (*CLASSIFIER_OUTPUTS, "multilabel")]
    return min(widths) if widths else model["classes"]


def _announce(job: JobContext, model: ModelRecord, engine: engines.Engine, what: str) -> None:
    """The job's first log line (`mxq logs`): what it runs, where, and why on that engine."""
    log.info("job %s: %s:%s on %s with %s %s (%s; %s): %s", job.id, model["name"], model["version"],
             job.device, engine.name, engine.precision, engine.reason, engine.precision_reason, what)


def _read_all(p: InferParams, source: InputSource) -> NDArray[np.float32]:
    """A small input whole, read and checked as one batch: copied, then the file checked again
    (a mapped .npy's read is a view, read by the model only after the fetch's own check)."""
    x = np.array(next(_batches(p, source, 0, source.count, lambda _: source.count))[1])
    unchanged(p, source)
    return x


def _merged(job: JobContext, p: InferParams, model: ModelRecord, source: InputSource) -> Outcome:
    """A small job, run in one batch with the queued small jobs of the same model (batching)."""
    engine = engines.pick(job, model, p.engine, source.count, _precision(p))
    members = [batching.Member(job.id, p, _read_all(p, source))]
    first = members[0].x[:engines.CHECK_SAMPLES]
    engine = engines.vetted(job, model, engine, lambda: first, p.engine, _precision(p), _seen(p, source))
    _announce(job, model, engine, f"{source.count} samples in one batch with the small jobs of "
              "its model that wait")
    members += batching.gather(job, model, open_submitted, _read_all, source.count)
    began = time.perf_counter()
    try:
        probs, fit, lead_error = _predict_members(job, p, engine, members)
    except Exception as exc:
        if device_fault(exc):
            batching.hand_back(job, members)
        raise
    parts = np.split(probs, np.cumsum([len(m.x) for m in members])[:-1])
    seconds = time.perf_counter() - began
    samples, share, result = batching.finish(job, members, parts, seconds, {
        "model": model["name"], "model_version": model["version"],
        "model_cache": "hit" if engine.cached else "miss", **_engine_fields(engine),
        "batch_size_used": fit.size, "output": "db",
        "classes": model["classes"], "batched_jobs": len(members), "batch_samples": len(probs),
        "batch_lead": job.id, "mxq_version": mxq_version()}, block)
    if lead_error is not None:  # batching.finish left members[0] to its task: this one is not it
        finish_batch(job.url, {members[0].id: (samples, share, result)},
                          batching.lead_fence(job), job.at)
        raise JobInputError(lead_error)
    return Outcome(samples=samples, seconds=share, result=result)


def _predict_members(job: JobContext, p: InferParams, engine: engines.Engine,
                     members: list[batching.Member]) -> tuple[NDArray[np.float32], BatchFit, str | None]:
    """The merged batch's probabilities, its fit, and the lead's error when its own output is
    not finite. A member whose output is not finite fails alone (its message names its sample)
    and leaves `members`; the rest run again without it. Raises when no member is left."""
    lead_error = None
    while True:
        x = np.concatenate([m.x for m in members])
        asked = _start_batch(p, len(x), job.settings.max_batch_size)
        # A lone job runs as asked; a merged batch in one forward pass (both halved if need be).
        fit = BatchFit(job, asked if len(members) == 1 else max(asked, len(x)))
        try:
            return fit.predict(engine, x), fit, lead_error
        except engines.NonFiniteOutput as exc:
            first = 0
            bad = next(m for m in members if (first := first + len(m.x)) > exc.row)
            index = exc.row - (first - len(bad.x))
            message = exc.describe(index, bad.x[index])
            if bad.id == job.id:
                lead_error = message
            else:
                jobs.fail(job.url, bad.id, message, worker=job.worker)
            members.remove(bad)
            if not members:
                raise JobInputError(message) from None


def _start_batch(p: InferParams, samples: int, limit: int) -> int:
    """The batch size to start with: the one asked, or for 'auto' the largest allowed."""
    if p.batch_size == "auto":
        return max(1, min(AUTO_BATCH_START, samples, limit))
    return p.batch_size


def read_size(batch: int, sample_shape: tuple[int, ...], batch_seconds: float | None) -> int:
    """Samples per read: whole batches of `batch`, at least one, at most about READ_BYTES, no
    more than FLUSH_ROWS holds (a flush of held rows stays under twice it), and no more than
    READ_SECONDS of compute at `batch_seconds` a batch (one batch until a batch was timed): a
    cancel, a preemption and a flush wait for the read in hand. A read is handed from the
    prefetch thread to the compute thread in one go: a batch at a time, a small model (a batch
    every 0.4 ms) lost a fifth of its job to the handoffs."""
    batch_bytes = batch * 4 * math.prod(sample_shape)
    by_time = int(READ_SECONDS / batch_seconds) if batch_seconds else 1
    return batch * max(1, min(READ_BYTES // max(1, batch_bytes), FLUSH_ROWS // batch, by_time))


def _batches(p: InferParams, source: InputSource, start: int, stop: int,
             size: Callable[[tuple[int, ...]], int]) -> Iterator[tuple[int, NDArray[np.float32]]]:
    """(first index, samples) per read of `size(sample shape)` samples (`read_size` at the current batch size:
    whole batches; `BatchFit.predict` computes them batch by batch, and the compute
    thread checks for a cancel or a preemption and flushes between reads: per batch, those
    checks cost a small model a tenth of its job), checked for NaN and infinities (always: what
    an engine answers for them differs); runs on the prefetch thread."""
    first = start
    while first < stop:
        x = _read(p, source, first, stop, size)
        yield first, x
        first += len(x)


def _read(p: InferParams, source: InputSource, first: int, stop: int,
          size: Callable[[tuple[int, ...]], int]) -> NDArray[np.float32]:
    """The next read from `first`: `size(sample shape)` samples, at most to `stop`, checked.

    The prefetch thread reads while the compute thread's batch takes memory; where that batch
    does not fit, the read can run out first (NumPy's MemoryError, not the engine's error the
    compute thread halves on): it is tried again every READ_RETRY_SECONDS, smaller as the batch
    size comes down, for at most READ_OOM_SECONDS, then the job fails as out of memory."""
    waited = 0.0
    while True:
        try:
            x = source.read(first, min(first + size(source.sample_shape), stop))
            _check_finite(p, source, first, x)
            return x
        except (InputError, StorageError) as exc:  # (an object replaced mid-read: ObjectChanged)
            raise JobInputError(str(exc)) from None
        except MemoryError:
            if waited >= READ_OOM_SECONDS:
                raise OutOfMemory(f"out of host memory reading samples from {first} of input "
                                  f"{p.input} (tried for {READ_OOM_SECONDS:g} s)") from None
            time.sleep(READ_RETRY_SECONDS)
            waited += READ_RETRY_SECONDS


def _check_finite(p: InferParams, source: InputSource, first: int, x: NDArray[np.float32]) -> None:
    """Refuse a read holding NaN, inf or -inf, naming the first such sample: one `isfinite`
    pass (`engines.first_non_finite`, as for the outputs; row sums cost five times as much and
    weighed a tenth of a small model's job); only a failing read is searched. `x` is
    preprocessed: a sample finite as stored blames the version's preprocessing, not the input."""
    if (bad := engines.first_non_finite(x)) is None:
        return
    row, found = bad
    if (overflow := source.overflow(first + row, found)) is not None:
        raise JobInputError(overflow)
    why = "--reject-nan is set" if p.reject_nan else \
        "mxq scores finite inputs only: fix or drop that sample"
    raise JobInputError(f"input {p.input} has {found} in sample {first + row} ({why})")


def _engine_fields(engine: engines.Engine) -> dict[str, object]:
    """What a job's result says of its engine and precision, and what vetting a variant cost it
    (`variant_check`: its seconds, and whether the figure was remembered; null in float32)."""
    check = engine.check
    return {"engine": engine.name, "engine_reason": engine.reason, "precision": engine.precision,
            "precision_reason": engine.precision_reason,
            "variant_check": None if check is None else {
                "seconds": check.seconds, "remembered": check.remembered,
                "samples_reused": check.samples_reused}}


def _precision(p: InferParams) -> engines.Precision:
    return engines.Precision(p.precision, p.min_agreement)


def _stopped_at(first: int, out: JobOutputs) -> str:
    """Where a job past its time limit stopped, all before it committed (kept)."""
    whole = out.start == 0 and out.stop == out.count
    of = f"{out.stop}" if whole else f"[{out.start}, {out.stop})"
    return f"stopped at sample {first} of {of} (the predictions before it are kept)"


def _reuse_checked(engine: engines.Engine, p: InferParams, source: InputSource, out: JobOutputs,
                   begin: int) -> int:
    """Where computing starts: after the input's first samples when the variant's check
    (`engines.vetted`) computed this engine's outputs for them, which the job keeps as its own
    (`variant_check.samples_reused`). A job that starts elsewhere (a later chunk, a resumed
    attempt) computes its own; outputs that are not finite are computed again, to fail the job
    on the sample that caused them."""
    held, engine.first_outputs = engine.first_outputs, None
    if held is None or begin != 0 or engine.check is None:
        return begin
    held = held[:out.stop]
    if engines.first_non_finite(held) is not None:
        return begin
    unchanged(p, source)  # as after every read: the check read these samples before
    out.add(0, held)
    out.job.costs.outputs_added()
    engine.check.samples_reused = len(held)
    return len(held)


def _stream(job: JobContext, p: InferParams, source: InputSource, engine: engines.Engine,
            out: JobOutputs, begin: int, fit: BatchFit) -> None:
    """Compute every batch from `begin` here; reading runs ahead and storing runs behind on
    side threads. A flush is due every FLUSH_SECONDS or `flush_rows` samples, and at the end."""
    writer = BackgroundWriter(out.store, in_flight=1)  # a kill loses the flush in store and the next
    step = _next_metric_step(job.url, job.id) if begin > out.start else 0  # after earlier points
    since, mark = time.perf_counter(), begin
    most = flush_rows(out.holds_results, out.classes, out.stop - out.start)
    costs = job.costs
    try:
        begin = _reuse_checked(engine, p, source, out, begin)
        if mark < begin == out.stop:  # the check's outputs were the whole job
            writer.submit(out.take(step, begin - mark, time.perf_counter() - since, begin))
        idle = job.parsed_device.kind == "cpu"  # the engine's threads hold the cores (pipeline)
        def size(shape: tuple[int, ...]) -> int:  # at the current batch size
            return read_size(fit.size, shape, fit.batch_seconds)

        for first, x in prefetch(_batches(p, source, begin, out.stop, size), idle=idle):
            try:
                job.check_cancelled(first - out.start)
            except JobCancelled:  # keep every result computed so far: hand the rest to the writer
                writer.submit(out.take(step, first - mark, time.perf_counter() - since, first))
                raise
            over = p.time_limit is not None and job.ran() >= p.time_limit
            if (job.preempt_asked() or over) and first > mark:  # a checkpoint now: flush, then stop
                writer.submit(out.take(step, first - mark, time.perf_counter() - since, first))
                step, since, mark = step + 1, time.perf_counter(), first
                writer.drain()  # stored and committed before the job yields or stops
                job.check_time_limit(p.time_limit, _stopped_at(first, out))
                job.check_preempted(first - out.start)
            last = first + len(x)
            try:
                probs = fit.predict(engine, x)
            except engines.NonFiniteOutput as exc:
                raise JobInputError(exc.describe(first + exc.row, x[exc.row])) from None
            unchanged(p, source)  # before the output takes them: `x` may be a view of the file
            out.add(first, probs)
            costs.outputs_added()
            now = time.perf_counter()
            if now - since >= FLUSH_SECONDS or last - mark >= most or last == out.stop:
                writer.submit(out.take(step, last - mark, now - since, last))
                step, since, mark = step + 1, now, last
    finally:
        writer.close()
