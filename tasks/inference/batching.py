"""Dynamic batching: many small inference jobs of one model run as one batch on one device.

A worker that starts a small job (at most MXQ_SMALL_JOB_SAMPLES samples, results to the
database) also claims, in SQL, the queued small jobs of the same model version on its own
queues, waiting up to MXQ_BATCH_WAIT_MS for more, up to MXQ_MERGE_SAMPLES samples in all. It
runs them as one forward pass, splits the results back, and finishes each job on its own (its
rows, samples, its share of the time). SQL stays the single place that decides who runs a job.
Their waiting broker messages are dropped as they are claimed, so the workers do not spend a
delivery and a claim on each (a message that got away is refused at its claim).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from mxq.db import batches, jobs
from mxq.db.fence import Fence
from mxq.db.outputs.blocks import Block
from mxq.db.records import ModelRecord
from mxq.json_types import JsonMapping
from mxq.priorities import Level
from mxq.tasks.inference.inputs import InputSource
from mxq.tasks.job_context import JobContext, JobInputError
from mxq.workers.broker import messages
from mxq.workers.broker.publish import Turn, publish
from mxq.workers.broker.queues import device_queue, pool_queues
from mxq.workers.hardware.devices import engines_for
from mxq.workers.jobs.jobspecs import InferParams, ParamsError, validated
from mxq.workers.settings import Settings

POLL_SECONDS = 0.001  # how often the wait for more jobs looks again
CANDIDATES = 2  # look at this many queued jobs per free sample slot (others may not match)
MAX_CANDIDATES = 512  # ... but never more in one look
CLAIM_SLICE = 64  # candidates opened, then claimed, at a time
GOLDEN = (5 ** 0.5 - 1) / 2  # spaces the devices' starting points, however many there are

# What the infer task hands in, so that this module needs no part of it: a job's input opened
# and checked, that input read whole, and a member's prediction rows as a block (owner job,
# first sample's index, probabilities, top k).
OpenInput = Callable[[Settings, InferParams, ModelRecord], InputSource]
ReadAll = Callable[[InferParams, InputSource], NDArray[np.float32]]
BlockOf = Callable[[int, int, NDArray[np.float32], int], Block]
Candidate = tuple[int, JsonMapping]  # a queued job's id and parameters as stored
T = TypeVar("T")


@dataclass
class Member:
    """A job taken into the batch, with its input."""

    id: int
    p: InferParams
    x: NDArray[np.float32]  # its samples, as the model takes them


def mergeable(p: InferParams, count: int, settings: Settings) -> bool:
    return (settings.dynamic_batching and count <= settings.small_job_samples and p.output == "db"
            and not p.chunk_size and p.start is None and p.stop is None)


def _queues(job: JobContext) -> list[str]:
    """The queues this worker consumes: its device's and its kind's pools for its engines."""
    spec, s = job.parsed_device, job.settings
    return [device_queue(job.at.node, spec.kind, spec.index),
            *pool_queues(spec.kind, engines_for(spec.kind, s.mxnet_unusable))]


# What members of one merged batch share: they run on one engine in one precision.
ASKS = ("engine", "precision", "min_agreement")


def _candidates(job: JobContext, model: ModelRecord, room: int,
                taken: set[int]) -> list[Candidate]:
    """Queued jobs that ask for the same model version, engine and precision (whether each is
    mergeable is decided once its input is open)."""
    found = batches.queued_infer(job.url, _queues(job), limit=min(MAX_CANDIDATES, max(8, room * CANDIDATES)),
                              level=job.priority)
    asks = {k: job.stored.get(k) for k in ASKS}
    return [(i, params) for i, params in found if i not in taken
            and params.get("model") == model["name"] and params.get("model_version") == model["version"]
            and {k: params.get(k) for k in ASKS} == asks]


def gather(job: JobContext, model: ModelRecord, open_input: OpenInput, read: ReadAll,
           samples: int) -> list[Member]:
    """Claim queued small jobs of the same model until the batch is full or the wait is over.

    Each one's input is opened and checked as its own job would; one that is wrong is claimed
    and failed on its own with its message, and the others go on.
    """
    s = job.settings
    members: list[Member] = []
    deadline = time.monotonic() + s.batch_wait_ms / 1000
    at, seen = job.at, {job.id}
    while samples < s.merge_samples:
        found = _candidates(job, model, s.merge_samples - samples, seen)
        seen.update(i for i, _ in found)
        for part in _slices(found, job.parsed_device.index):
            samples += _take(job, model, part, open_input, read, at, members)
            if samples >= s.merge_samples:
                break
        if samples >= s.merge_samples or time.monotonic() >= deadline:
            break
        if not found:
            time.sleep(POLL_SECONDS)
    return members


def _slices(found: list[T], index: int) -> list[list[T]]:
    """The candidates in slices of CLAIM_SLICE, starting at a point of their own for each device
    (golden-ratio spacing) and wrapping around: workers gathering at once mostly open different
    inputs, instead of all opening the oldest ones and most losing them at the claim."""
    start = int((index * GOLDEN) % 1 * len(found))
    walk = found[start:] + found[:start]
    return [walk[i:i + CLAIM_SLICE] for i in range(0, len(walk), CLAIM_SLICE)]


def _take(job: JobContext, model: ModelRecord, found: list[Candidate],
          open_input: OpenInput, read: ReadAll, at: jobs.Placement, members: list[Member]) -> int:
    """Open `found`, claim the mergeable ones still queued, add them to `members`; the samples
    added."""
    s = job.settings
    opened = {}
    for job_id, params in found:
        item = _open(s, params, model, open_input)
        if isinstance(item, str) or mergeable(item[0], item[1].count, s):
            opened[job_id] = item
    claimed = batches.claim_many(job.url, list(opened), at)
    messages.drop_waiting(s.broker, _queues(job), claimed)
    added = 0
    for job_id in claimed:
        item = opened[job_id]
        if isinstance(item, str):
            jobs.fail(job.url, job_id, item, worker=at.worker)
            continue
        p, source = item
        try:
            members.append(Member(job_id, p, read(p, source)))
            added += source.count
        except JobInputError as exc:
            jobs.fail(job.url, job_id, str(exc), worker=at.worker)
    return added


def _open(s: Settings, params: JsonMapping, model: ModelRecord,
          open_input: OpenInput) -> tuple[InferParams, InputSource] | str:
    """A candidate's parameters and input, or why its job fails."""
    try:
        p = validated(InferParams, params, s.limits)
        return p, open_input(s, p, model)
    except (JobInputError, ParamsError) as exc:
        return str(exc)
    except Exception as exc:  # a broken input fails its own job, never the batch
        return f"{type(exc).__name__}: {exc}"


def finish(job: JobContext, members: list[Member], probs: list[NDArray[np.float32]], seconds: float,
           result: dict[str, object], block_of: BlockOf) -> tuple[int, float, dict[str, object]]:
    """Store the rows of every member the batch still holds and finish each with its share of
    the time, in one transaction (`batches.finish_batch`); return the lead's (first member's)
    outcome, which its own task records."""
    total = float(sum(len(m.x) for m in members))
    blocks = [block_of(m.id, 0, pr, m.p.top_k) for m, pr in zip(members, probs, strict=True)]
    outcomes = {m.id: (len(m.x), seconds * len(m.x) / total,
                       {**result, "input": m.p.input, "range": [0, len(m.x)],
                        "batch_size": m.p.batch_size}) for m in members}
    batches.finish_batch(job.url, outcomes, lead_fence(job), job.at, blocks)
    # Messages published after the claim (a submit still under way) are dropped too.
    messages.drop_waiting(job.settings.broker, _queues(job), [m.id for m in members[1:]])
    return outcomes[members[0].id]


def lead_fence(job: JobContext) -> Fence:
    """The attempt the batch runs in: its lead's."""
    assert job.fence is not None  # a batch runs inside its lead's claimed attempt
    return job.fence


def hand_back(job: JobContext, members: list[Member]) -> None:
    """The device failed under a merged batch: every member but the lead (which the job frame
    sends back as a device fault) is queued again without using an attempt, to run elsewhere;
    before, they stayed running on a worker that left, until the reconciler charged them one."""
    s, worker = job.settings, job.worker
    for job_id, queue, priority in batches.hand_back(job.url, [m.id for m in members[1:]], worker):
        publish(s, job_id, job.kind, queue, patient=True, turn=Turn(Level(priority), started=True))
