"""How often and how long a running stack waits: heartbeats, schedule ticks, the reconciler's
passes, a job's cancel checks and progress writes, stalls, retries, dynamic batching's wait,
and what the retention pass and quota borrowing do. The defaults are what a fleet should pay
(each is a statement per running job or a sleep per deferral); tests run their stacks at a
fraction."""

from __future__ import annotations

from pydantic import Field

from mxq.workers.settings.part import DAY, HOUR, Part

# Workers write a heartbeat this often; a device whose last one is older than
# HEARTBEAT_TTL_FACTOR times this is taken for dead.
DEFAULT_HEARTBEAT_SECONDS = 2.0
HEARTBEAT_TTL_FACTOR = 5
# A job whose worker dies this many times is failed rather than retried forever.
DEFAULT_MAX_ATTEMPTS = 3
# Schedules fire at minute granularity; a tick every 15 s keeps them within a quarter minute.
DEFAULT_TICK_SECONDS = 15.0
# The reconciler (in the schedule process) compares SQL with the broker this often.
DEFAULT_RECONCILE_SECONDS = 30.0
# The reconciler looks at the broker twice this far apart before it calls a message lost.
DEFAULT_RECONCILE_LOOK_SECONDS = 1.0
# Dynamic batching: a worker running a small inference job (at most this many samples) also takes
# queued small jobs of the same model, up to DEFAULT_MERGE_SAMPLES samples in one batch, waiting
# at most DEFAULT_BATCH_WAIT_MS for more to arrive.
DEFAULT_SMALL_JOB_SAMPLES = 64
DEFAULT_MERGE_SAMPLES = 1024
DEFAULT_BATCH_WAIT_MS = 5.0
# A running job with no progress for this long is failed (its worker still beating: a read that
# blocks for good); a cancel not heeded this long is enforced.
DEFAULT_STALL_SECONDS = 3600.0
DEFAULT_CANCEL_GRACE_SECONDS = 120.0
# A device call (a batch's forward pass, a training's batch) that has not finished for this long,
# and for this many times the slowest batch of the job so far, is taken for a hung device: no
# real GPU computes one batch for five minutes, and a job whose batches are slow keeps its margin.
DEFAULT_DEVICE_HANG_SECONDS = 300.0
DEFAULT_DEVICE_HANG_FACTOR = 10.0
# A worker's start check (a small matmul on its device) that has not finished in this long fails:
# creating a CUDA context and loading cuBLAS and cuDNN take seconds, not minutes.
DEFAULT_START_CHECK_SECONDS = 120.0
# A multi-node training whose nodes have not all joined after this long fails: one node's
# device may be busy with a long job, or the node is down. The started nodes wait idle till then.
DEFAULT_DIST_START_SECONDS = 300.0


class CadenceFields(Part):
    heartbeat_seconds: float = Field(DEFAULT_HEARTBEAT_SECONDS, gt=0, le=HOUR)
    max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1, le=100)
    reprobe_seconds: float = Field(60.0, gt=0, le=HOUR, description="A device whose worker refused it "
                                   "or whose device failed mid-job is probed again (its worker started, "
                                   "its start check run) after this long, twice as long after each "
                                   "refusal in a row, up to 30 minutes.")
    tick_seconds: float = Field(DEFAULT_TICK_SECONDS, gt=0, le=DAY, description="Schedule tick period.")
    cancel_check_seconds: float = Field(2.0, gt=0, le=HOUR, description="How often a running job "
                                        "looks for a cancel request (a statement per running job).")
    progress_seconds: float = Field(2.0, gt=0, le=HOUR, description="How often a running job "
                                    "writes its progress (a statement per running job).")
    defer_seconds: float = Field(1.0, gt=0, le=HOUR, description="How long a message a worker "
                                 "cannot take now waits before it goes back to its queue.")
    model_trial_seconds: float = Field(120.0, gt=0, le=HOUR, description="Longest the trial run "
                                       "of a plain ONNX file being registered may take, per batch.")
    reconcile_seconds: float = Field(DEFAULT_RECONCILE_SECONDS, gt=0, le=DAY,
                                     description="How often the reconciler runs.")
    keep_output_days: int | None = Field(
        None, ge=1, le=36500, description="Remove the outputs (files in this home, SQL rows) of "
        "inference jobs finished more than this many days ago, except pinned ones (`mxq pin`); "
        "unset = keep every output.")
    keep_versions: int | None = Field(
        None, ge=1, le=10000, description="Keep each model's newest this many versions; remove "
        "the files of older unpromoted ones (never a promoted one, nor one a queued or running "
        "job names); unset = keep every version.")
    reconcile_look_seconds: float = Field(
        DEFAULT_RECONCILE_LOOK_SECONDS, gt=0, le=60,
        description="Seconds between the reconciler's two looks at the broker."
    )
    dynamic_batching: bool = Field(True, description="Merge small inference jobs of one model.")
    quota_borrowing: bool = Field(False, description="Let a job beyond its owner's quota borrow a "
                                  "device no one else's job waits for; preemptible, taken back first.")
    small_job_samples: int = Field(DEFAULT_SMALL_JOB_SAMPLES, ge=1, le=2**24)
    merge_samples: int = Field(DEFAULT_MERGE_SAMPLES, ge=1, le=2**24)
    batch_wait_ms: float = Field(DEFAULT_BATCH_WAIT_MS, ge=0, le=60_000)
    stall_seconds: float = Field(DEFAULT_STALL_SECONDS, gt=0, le=30 * DAY, description="A running job that "
                                 "reports no progress this long is failed by the reconciler.")
    cancel_grace_seconds: float = Field(DEFAULT_CANCEL_GRACE_SECONDS, gt=0, le=DAY, description="A running "
                                        "job that has not stopped this long after its cancel is "
                                        "cancelled by the reconciler; a worker whose job was taken "
                                        "from it this long ago and is still in it exits.")
    device_hang_seconds: float = Field(
        DEFAULT_DEVICE_HANG_SECONDS, ge=1, le=DAY, description="A batch that has not finished on "
        "its device for this long (and for MXQ_DEVICE_HANG_FACTOR times the job's slowest batch so "
        "far) takes the device out as hung: the job goes back to its queue without using an "
        "attempt and the worker is replaced.")
    device_hang_factor: float = Field(
        DEFAULT_DEVICE_HANG_FACTOR, ge=2, le=10_000, description="A hung batch has also run this "
        "many times the job's slowest batch so far.")
    start_check_seconds: float = Field(
        DEFAULT_START_CHECK_SECONDS, ge=1, le=HOUR, description="A worker's start check of its "
        "device that has not finished in this long fails: the device stays out, probed again later.")
    dist_start_seconds: float = Field(DEFAULT_DIST_START_SECONDS, gt=0, le=DAY,
                                      description="How long a multi-node training waits for all "
                                      "its nodes to join before it fails.")

    @property
    def heartbeat_ttl(self) -> float:
        return self.heartbeat_seconds * HEARTBEAT_TTL_FACTOR
