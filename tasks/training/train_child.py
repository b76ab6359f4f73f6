"""The training child process: `python -m mxq.tasks.training.train_child JOB_ID DEVICES ATTEMPT WORKER`.

Started by the job's leader worker with exactly the leased devices visible; trains, checkpoints
each epoch, resumes from the last checkpoint of an earlier attempt, and registers the model.
Its outcome goes to the run file the leader reads (`child_report`); exit 3 means bad input.

It reports progress and heeds a cancel through the job frame the leader's own body would use
(`mxq.tasks.runner.JobContext`: a progress write at most every MXQ_PROGRESS_SECONDS that also answers
the cancel check). Every write it makes carries its attempt's fence (`mxq.db.fence`): a child
whose leader was paused and taken for dead stops at its next progress write, cancel check or
epoch (exit CHILD_LOST) and never registers a version; checkpoints live in a folder of that
attempt's own.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from mxq.db import jobs
from mxq.db.fence import Fence
from mxq.db.outputs import epochs as epoch_rows
from mxq.db.records import EpochResult
from mxq.db.stack import stack_id
from mxq.device import Device
from mxq.errors import MxqError, device_fault, first_line, named_device, reason, typed_line
from mxq.tasks.job_context import JobCancelled, JobContext, JobLost, JobPreempted, JobTimedOut, context_of
from mxq.tasks.model_store import user_code
from mxq.tasks.model_store.locations import CodeMissing, arch_file
from mxq.tasks.model_store.models import trainable
from mxq.tasks.model_store.user_code import CodeError, check_output
from mxq.tasks.runtimes.mx import gluon, mx
from mxq.tasks.training import child_report
from mxq.tasks.training.child_report import Preempted, Refused, Stopped, Trained
from mxq.tasks.training.registration import register
from mxq.tasks.training.train_loop import (
    fit,
    make_net,
    make_trainer,
    share_initial_weights,
    source_net,
)
from mxq.tasks.training.train_task import (
    CHILD_CANCELLED,
    CHILD_HUNG,
    CHILD_INPUT_ERROR,
    CHILD_LOST,
    CHILD_PREEMPTED,
    CHILD_TIMED_OUT,
    ready_file,
    run_file,
)
from mxq.tasks.training.training_data import BadInput, Data, load_data
from mxq.workers.fleet.hang_watch import watch_in_thread
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.settings import Settings, get_settings
from mxq.workers.storage.client import StorageError


def checkpoint_dir(s: Settings, fence: Fence) -> Path:
    """This attempt's checkpoints: under the stack's id (another database, other folders) and
    the attempt's tag (a paused attempt never overwrites the files a later one resumes from)."""
    return s.home_path / "checkpoints" / stack_id(s.database) / f"job-{fence.job_id}" / fence.tag


def resume(url: str, job_id: int, net: gluon.HybridBlock, trainer: gluon.Trainer,
           ctxs: list[mx.Context]) -> int:
    """The last epoch an earlier attempt finished and checkpointed (0: none), loaded into net."""
    for e in epoch_rows.list_epochs(url, job_id)[::-1]:  # the last epoch first
        params, states = Path(f"{e['checkpoint']}.params"), Path(f"{e['checkpoint']}.states")
        if params.exists() and states.exists():
            net.load_parameters(str(params), ctx=ctxs)
            trainer.load_states(str(states))
            return e["epoch"]
    return 0


def _join(s: Settings, p: TrainParams, job_id: int, devices: list[str]
          ) -> tuple[mx.kv.KVStore | None, int, int, list[str]]:
    """The kvstore, this worker's rank, the number of workers and the device labels: for one
    node's part of a multi-node training (DMLC_* set by the leader) after joining the others."""
    if p.dist is None:
        return None, 0, 1, devices
    kv = mx.kv.create("dist_sync")  # returns once every node's worker and the server joined
    ready_file(s, job_id).write_text(json.dumps({"rank": kv.rank}))
    return kv, kv.rank, kv.num_workers, [f"{d}@{s.node}" for d in devices]


def _part_rates(results: list[EpochResult], labels: list[str], samples: int,
                seconds: float) -> dict[str, object]:
    """A multi-node part's own samples/s, overall and per device (time-weighted over epochs)."""
    if not seconds:
        return {"samples_per_sec": None, "per_device": {}}
    return {"samples_per_sec": samples / seconds,
            "per_device": {k: sum(r["per_device"][k] * r["seconds"] for r in results) / seconds
                           for k in labels}}


def _record_throughput(url: str, fence: Fence, r: EpochResult) -> None:
    """One throughput point per device per epoch, as inference records one per flush, so the
    job's chart and `mxq_device_samples_per_second` show training too."""
    for i, (device, rate) in enumerate(sorted(r["per_device"].items())):
        if not jobs.record_metric(url, fence, (r["epoch"] - 1) * len(r["per_device"]) + i, device,
                                  round(rate * r["seconds"]), r["seconds"]):
            raise JobLost(f"job {fence.job_id} is no longer attempt {fence.attempt}'s: "
                          f"epoch {r['epoch']}'s throughput not recorded")


def epoch_line(r: EpochResult, epochs: int) -> str:
    """An epoch's summary as the child prints it: `epoch 2/5: loss 0.4810 train_accuracy 0.8532
    val_accuracy 0.8410 (5321 samples/s)`."""
    val = "-" if r["val_accuracy"] is None else f"{r['val_accuracy']:.4f}"
    return (f"epoch {r['epoch']}/{epochs}: loss {r['train_loss']:.4f} train_accuracy "
            f"{r['train_accuracy']:.4f} val_accuracy {val} ({r['samples_per_sec']:.0f} samples/s)")


def _frame(s: Settings, fence: Fence, devices: list[str]) -> JobContext | None:
    """The job frame this attempt reports through, as the leader's would: fenced, on `devices`."""
    row = jobs.job_row(s.database, fence.job_id)
    if row is None:
        return None
    job = context_of(row, devices[0], s)
    job.devices, job.worker, job.fence = devices, fence.worker, fence
    return job


@dataclass
class Training:
    """This attempt's training: its job frame, its net on its devices, where it checkpoints."""

    job: JobContext
    fence: Fence
    p: TrainParams
    data: Data
    net: gluon.HybridBlock
    trainer: gluon.Trainer
    ctxs: list[mx.Context]  # one per device
    labels: list[str]  # the devices' names in its figures
    rank: int  # this worker's, of `workers` (one but for a multi-node part)
    workers: int
    folder: Path  # this attempt's checkpoints
    done: int  # the epochs an earlier attempt finished, resumed from
    samples: int  # per epoch: this worker's shard

    def on_batch(self, epoch: int, fraction: float) -> None:
        """A batch came back from the devices: the watch's progress, the job's, its checks (a
        single-node training stops at the batch past its time limit; a node of a multi-node one
        stops with the others, at an epoch)."""
        self.job.watch.batch_done()
        self.job.progress((epoch - 1 + fraction) / self.p.epochs)
        self.job.check_cancelled()
        if self.p.dist is None:
            self.job.check_time_limit(self.p.time_limit, f"stopped in epoch {epoch} of "
                                      f"{self.p.epochs} (the checkpoints of its finished epochs are kept)")

    def on_epoch(self, r: EpochResult) -> None:
        """Checkpoint the epoch and record it and its throughput, each write fenced; the device
        watch rests meanwhile (the host's work) and watches the next epoch's batches."""
        self.job.watch.end()
        self._checkpoint(r)
        if r["epoch"] < self.p.epochs:
            self.job.watch.begin()

    def _checkpoint(self, r: EpochResult) -> None:
        url, fence = self.job.url, self.fence
        prefix = self.folder / f"epoch-{r['epoch']:04d}"
        if self.rank == 0:  # (the weights and optimizer states are the same on every worker)
            self.net.save_parameters(f"{prefix}.params")
            self.trainer.save_states(f"{prefix}.states")
        row = {**r, "checkpoint": str(prefix) if self.rank == 0 else None}
        if not epoch_rows.record(url, fence.job_id, row, fence):
            raise JobLost(f"job {fence.job_id} is no longer attempt {fence.attempt}'s: "
                          f"epoch {r['epoch']} not recorded")
        _record_throughput(url, fence, r)
        print(epoch_line(r, self.p.epochs), flush=True)  # the job's log (`mxq logs`) shows it
        self.job.progress(r["epoch"] / self.p.epochs)
        checkpoint = self.p.dist is None and r["epoch"] < self.p.epochs  # where it may yield
        if checkpoint:  # asked now, not at the next rate-limited check: a waiting job may be asking
            self.job.heard(jobs.run_check(url, fence))
        self.job.check_cancelled()
        if self.p.dist is not None:
            epoch_rows.merge_parts(url, self.p.dist.parent)  # the job's epoch, once every node has it
        if r["epoch"] < self.p.epochs:  # past its time limit: stop here, this epoch kept
            self.job.check_time_limit(self.p.time_limit, f"stopped after epoch {r['epoch']} of "
                                      f"{self.p.epochs} (its checkpoints are kept)")
        if checkpoint:
            self.job.check_preempted()


def _prepare(s: Settings, job: JobContext, fence: Fence, p: TrainParams, data: Data) -> Training:
    """Join the other nodes (a multi-node part), build the net and its trainer on the devices,
    and resume from an earlier attempt's last checkpoint (a single-node job only)."""
    train = data.train
    kv, rank, workers, labels = _join(s, p, fence.job_id, job.devices)
    on_gpu = Device.parse(job.devices[0]).is_gpu
    ctxs = [mx.gpu(i) if on_gpu else mx.cpu(i) for i in range(len(job.devices))]
    if data.source is None:
        net = make_net(p, train.classes, train.sample_shape, ctxs, _own_block(s, p, data))
        if p.arch_sha256 is not None:  # its output checked as at its registration, on the devices
            _checked(lambda: check_output(net, p.arch or "", data.version.classes,
                                          train.sample_shape, ctxs[0], p.dtype))
    else:  # its own graph, with its weights or fresh ones
        net = source_net(trainable(s, data.source, ctxs, p.dtype), p)
    trainer = make_trainer(p, net, on_gpu, kv)
    if kv is not None:
        share_initial_weights(net, trainer, ctxs, train.sample_shape, p.dtype)
    done = resume(job.url, fence.job_id, net, trainer, ctxs) if kv is None else 0  # parts never resume
    folder = checkpoint_dir(job.settings, fence)
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    return Training(job, fence, p, data, net, trainer, ctxs, labels, rank, workers, folder, done,
                    len(train.y) // workers)


def _own_block(s: Settings, p: TrainParams, data: Data) -> gluon.HybridBlock | None:
    """A registered architecture's net, built in this child by its code as pinned at submit
    (None: a built-in's)."""
    if p.arch_sha256 is None or p.arch_factory is None:
        return None
    sha256, factory = p.arch_sha256, p.arch_factory
    return _checked(lambda: user_code.build(arch_file(s, sha256), sha256, p.arch or "", factory,
                                            f"{p.arch}@{sha256[:12]}", data.version.classes,
                                            data.train.sample_shape))


T = TypeVar("T")


def _checked(step: Callable[[], T]) -> T:
    """A step of a registered architecture's code, its problem the job's one line (BadInput)."""
    try:
        return step()
    except (CodeError, CodeMissing, StorageError) as exc:
        raise BadInput(str(exc)) from None


def _train(s: Settings, t: Training) -> Trained:
    """The remaining epochs, then (rank 0: one registration per job, a multi-node job's parts
    share the weights) the trained version: the report of a success."""
    p = t.p
    out = run_file(s, t.fence)
    t.job.watch.begin()
    watch_in_thread(t.job.watch, ", ".join(t.job.devices), lambda why: _hung(out, why),
                    s.heartbeat_seconds)
    results = fit(p, t.data.train, t.data.val, t.ctxs, t.labels, t.net, t.trainer, t.done + 1,
                  t.on_batch, t.on_epoch, t.rank, t.workers, t.data.version.outputs)
    final = epoch_rows.list_epochs(t.job.url, t.fence.job_id)[-1]
    metrics = {"val_accuracy": final["val_accuracy"], "train_accuracy": final["train_accuracy"],
               "train_loss": final["train_loss"], "epochs": p.epochs}
    seconds = sum(r["seconds"] for r in results)
    result: dict[str, object] = {"model": p.name, "resumed_from_epoch": t.done, "devices": t.labels,
                              **metrics}
    if t.rank == 0:
        result.update(register(s, p, t.fence, t.net, t.data, metrics, t.ctxs[0]))
    if p.dist is not None:
        result.update(rank=t.rank, workers=t.workers, node=s.node,
                      **_part_rates(results, t.labels, t.samples * len(results), seconds))
    return Trained(samples=t.samples * len(results), seconds=seconds, result=result)


def _hung(out: Path, why: str) -> None:
    """From the watchdog's thread: a batch never came back from the devices, and the thread in
    the device call cannot leave it. Reported as the device's fault, of every device of the
    training (which one hung is unknown: each is probed before it takes work), and the process
    ends (`CHILD_HUNG`)."""
    child_report.write(out, Refused(error=why, device_fault=True))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CHILD_HUNG)


def main(s: Settings, fence: Fence, devices: list[str]) -> int:
    """Train the job's remaining epochs on `devices` as attempt `fence`; the exit status, with
    the report it leaves in the run file (`child_report`), says how it ended."""
    job = _frame(s, fence, devices)
    if job is None:
        return CHILD_INPUT_ERROR
    p = job.params(TrainParams)
    out = run_file(s, fence)
    try:
        data = load_data(s, p)
    except BadInput as exc:
        child_report.write(out, Refused(error=str(exc)))
        return CHILD_INPUT_ERROR
    try:
        t = _prepare(s, job, fence, p, data)
    except BadInput as exc:  # a registered architecture's code that does not build or fit
        child_report.write(out, Refused(error=str(exc)))
        return CHILD_INPUT_ERROR
    try:
        child_report.write(out, _train(s, t))
    except JobCancelled:  # checkpoints of finished epochs stay
        child_report.write(out, Stopped(samples=_trained(s, t, fence)))
        return CHILD_CANCELLED
    except JobPreempted as exc:  # the next attempt resumes from the last checkpoint
        child_report.write(out, Preempted(samples=_trained(s, t, fence), to=exc.to))
        return CHILD_PREEMPTED
    except JobLost as exc:
        child_report.write(out, Refused(error=str(exc)))
        return CHILD_LOST
    except JobTimedOut as exc:  # as a cancel: the finished epochs' checkpoints stay
        child_report.write(out, Refused(error=str(exc)))
        return CHILD_TIMED_OUT
    return 0


def _trained(s: Settings, t: Training, fence: Fence) -> int:
    """The samples this attempt trained on in the epochs it finished."""
    return t.samples * (len(epoch_rows.list_epochs(s.database, fence.job_id)) - t.done)


def report_crash(s: Settings, fence: Fence, exc: BaseException, devices: list[str]) -> None:
    """Tell the leader, through the run file, why the child died (one line): an expected failure
    (a database unreachable past its retry window, say) as its own words, anything else with its
    type, instead of "training process exited with 1".

    A device fault is judged here, on the whole error: MXNet 1.9.1's errors start "Traceback
    (most recent call last):" whatever went wrong, so their first line tells the leader nothing;
    such a one is reported by its line that says what happened (`reason`), marked the device's,
    with the device of `devices` (the contexts gpu(0)... in order) it names, if it names one."""
    if device_fault(exc):
        report = Refused(error=f"{type(exc).__name__}: {reason(exc, 500)}", device_fault=True,
                         faulted=named_device(str(exc), devices))
    else:
        report = Refused(error=first_line(exc, 500) if isinstance(exc, MxqError) else typed_line(exc))
    child_report.write(run_file(s, fence), report)


if __name__ == "__main__":
    job, devs = int(sys.argv[1]), sys.argv[2].split(",")
    fence = Fence(job, sys.argv[4], int(sys.argv[3]))
    settings = get_settings()  # the child's edge: read once, passed down
    # A dist_sync worker's kvstore waits at exit for every other worker: leaving after an error
    # must skip it (os._exit), or the process would hang there (its peers may never come).
    try:
        code = main(settings, fence, devs)
    except BaseException as exc:  # reported to the leader through the run file
        traceback.print_exc()
        report_crash(settings, fence, exc, devs)
        code = 1
    if code != 0 and os.environ.get("DMLC_ROLE") == "worker":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
