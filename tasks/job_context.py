"""What a job's body sees of its run (`JobContext`: its parameters, its device, its settings, the
checks it makes at its checkpoints), what it returns (`Outcome`, or a `FanOut` into chunk jobs),
and the exceptions that end it otherwise; `tasks/runner.py` runs the body in this frame and
records each of them as the job's outcome.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from mxq.db import jobs
from mxq.db.fence import Fence
from mxq.db.jobs import Placement
from mxq.db.records import JobRow
from mxq.db.schema import utcnow
from mxq.db.sharing import preemption
from mxq.device import Device
from mxq.errors import UserError
from mxq.json_types import JsonMapping
from mxq.priorities import NORMAL, Level
from mxq.since import format_duration
from mxq.tasks.fixed_costs import FixedCosts
from mxq.workers.fleet.hang_watch import DeviceWatch
from mxq.workers.jobs.jobspecs import JobParams, P, ParamsError, validated
from mxq.workers.settings import Settings


class JobInputError(UserError):
    """The job's parameters are wrong; the message says which and what is allowed."""


class JobTimedOut(UserError):
    """The job ran past its `time_limit` (counted from its first start, across attempts) and
    stopped at a checkpoint, keeping what it committed: it fails with this one line, which names
    the limit (`JobContext.check_time_limit`)."""


class JobFailed(RuntimeError):
    """The job cannot go on (e.g. a node of a multi-node training died); fails with the message."""


class JobCancelled(Exception):
    """The job was cancelled while running; it stopped at a batch or epoch boundary."""

    def __init__(self, samples: int | None = None) -> None:
        super().__init__("cancelled")
        self.samples = samples


class JobPreempted(Exception):
    """The job stopped at a checkpoint (a flush, an epoch) to yield its devices to the waiting job
    `to`; what it committed is kept, and it goes back to the queue to resume there."""

    def __init__(self, to: int, samples: int | None = None) -> None:
        super().__init__(f"yielded to job {to}")
        self.to = to
        self.samples = samples


class JobLost(Exception):
    """The job was given to another attempt (this one was taken for dead): stop; every write it
    tried since was refused, and files it wrote under its own name are removed."""



@dataclass
class Outcome:
    samples: int
    seconds: float  # compute time, queue time apart
    result: dict[str, object] = field(default_factory=dict)  # stored as JSON with the job


@dataclass
class FanOut:
    """The job is split: one chunk job per parameters, run wherever the parent was routed (or,
    with `queues`, chunk i on queues[i], asking for device requested[i])."""

    chunks: Sequence[JobParams]
    queues: list[str] | None = None
    requested: list[str] | None = None


@dataclass
class JobContext:
    id: int
    kind: str
    stored: JsonMapping  # its parameters as SQL holds them: a body reads them typed, with `params`
    device: str  # "cpu:1"
    settings: Settings  # the worker's, passed in: a job body reads no process-wide settings
    queue: str
    requested: str
    parent_id: int | None
    devices: list[str] = field(default_factory=list)  # all it holds; [device] for one-device jobs
    worker: str = ""  # the worker that claimed it
    node: str = ""  # that worker's node ("": its settings' node)
    fence: Fence | None = None  # this attempt's, from the claim: every write it makes carries it
    # Inference: where earlier attempts stopped storing results (read with the row: a worker
    # still writing then is fenced off by the claim, and what it adds is cleared on resume).
    committed: int | None = None
    priority: Level = NORMAL  # its level: the turn it is published again at
    started: bool = False  # an earlier attempt ran: published again ahead of its level's new jobs
    # When its time limit counts from: its first attempt's start (its parent's for a chunk or a
    # node's part), as the row said before the claim; the claim sets it for a first attempt.
    clock_from: datetime | None = None
    _checked_at: float = field(default_factory=time.monotonic)
    _progress_at: float = field(default_factory=time.monotonic)
    _verdict: jobs.RunCheck = jobs.RunCheck.GO_ON  # the last cancel check's
    # `device` parsed once, here where the job's device enters its frame: the body reads its kind,
    # its index and its MXNet context from this, not from the text again.
    parsed_device: Device = field(init=False)
    # Its device progress: the body arms it around its device work (a batch's forward pass, a
    # training's epochs) and another thread asks it whether the device hung (`hang_watch`).
    watch: DeviceWatch = field(init=False)
    # what its start and end cost (the result's `fixed_costs`), from its claim (`runner`)
    costs: FixedCosts = field(init=False)

    def __post_init__(self) -> None:
        self.parsed_device = Device.parse(self.device)
        self.costs = FixedCosts(time.perf_counter())
        self.watch = DeviceWatch(self.settings.device_hang_seconds, self.settings.device_hang_factor)

    def params(self, spec: type[P]) -> P:
        """The job's parameters as `spec` (its kind's), checked again here against this worker's
        limits; JobInputError (the job fails with it) when they do not fit."""
        try:
            return validated(spec, self.stored, self.settings.limits)
        except ParamsError as exc:
            raise JobInputError(str(exc)) from None

    @property
    def url(self) -> str:
        """The job database's URL."""
        return self.settings.database

    @property
    def at(self) -> Placement:
        """Where this attempt runs: the worker that claimed it, its node, its device."""
        return Placement(worker=self.worker, node=self.node or self.settings.node, device=self.device)

    def progress(self, fraction: float) -> None:
        """Report progress (written at most every MXQ_PROGRESS_SECONDS: tiny jobs skip it); the
        write also says whether the job was cancelled or taken, for the next `check_cancelled`.
        How often a running job looks for a cancel request and writes its progress: each is a
        statement per running job, so at 1,000 devices every second of these cadences is 1,000
        statements a second (bench: fleet); the dashboard refreshes every 2 s."""
        now = time.monotonic()
        if now - self._progress_at < self.settings.progress_seconds:
            return
        self._progress_at = self._checked_at = now
        self._verdict = jobs.set_progress(self.url, self.id, fraction, self.fence)

    def check_owned(self) -> None:
        """Raise JobLost if the job is no longer this attempt's: called right before a write that
        no SQL statement fences (an .npy slice); asks SQL only when the last answer is older
        than MXQ_CANCEL_CHECK_SECONDS, as after a pause."""
        now = time.monotonic()
        if now - self._checked_at >= self.settings.cancel_check_seconds and self.fence is not None:
            self._checked_at = now
            self._verdict = jobs.run_check(self.url, self.fence)
        if self._verdict is jobs.RunCheck.LOST:
            raise JobLost(f"job {self.id} now belongs to another attempt")

    def heard(self, verdict: jobs.RunCheck) -> None:
        """What a write that also checked the job said (a commit of results): the next
        `check_cancelled` or `preempt_asked` uses it."""
        self._checked_at = time.monotonic()
        self._verdict = verdict

    def preempt_asked(self) -> bool:
        """A waiting job of a higher level asked this one to yield, as the last check said."""
        return self._verdict is jobs.RunCheck.PREEMPT

    def check_preempted(self, samples: int | None = None) -> None:
        """At a checkpoint (everything computed is committed): raise JobPreempted when asked to
        yield and the job asking still waits; a request it outlived is dropped and the job goes on."""
        if not self.preempt_asked() or self.fence is None:
            return
        to = preemption.yield_target(self.url, self.fence)
        if to is None:
            self._verdict = jobs.RunCheck.GO_ON
            return
        raise JobPreempted(to, samples)

    def ran(self) -> float:
        """Seconds since the job's first start (its time limit's clock), 0 before its claim."""
        return 0.0 if self.clock_from is None else (utcnow() - self.clock_from).total_seconds()

    def check_time_limit(self, limit: int | None, stopped: str) -> None:
        """At a checkpoint (everything computed is committed): raise JobTimedOut when the job has
        run `limit` seconds or more since its first start, saying where it `stopped`."""
        if limit is not None and (ran := self.ran()) >= limit:
            raise JobTimedOut(f"time limit {format_duration(limit)} reached after {ran:.0f} s: "
                              f"{stopped}")

    def check_cancelled(self, samples: int | None = None) -> None:
        """Raise JobCancelled if a cancel was requested, JobLost if the job is not ours any more
        (looked up at most every MXQ_CANCEL_CHECK_SECONDS, unless a progress write just said)."""
        self.check_owned()
        if self._verdict is jobs.RunCheck.CANCEL:
            raise JobCancelled(samples)



def context_of(row: JobRow, device: str, settings: Settings) -> JobContext:
    """The frame of `row`'s job on `device` alone, before its claim; the training child makes
    the same frame, then gives it the devices and the fence its leader claimed with."""
    return JobContext(row["id"], row["kind"], row["params"], device, settings, row["queue"],
                      row["requested_device"], row["parent_id"], [device], committed=row["committed"],
                      priority=Level(row["priority"]), started=row["attempts"] > 0,
                      clock_from=row["clock_from"])
