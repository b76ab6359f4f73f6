"""Pause faults: a device worker SIGSTOPped past its heartbeat, so the reconciler hands its job to
the other device, then SIGCONTed while (or after) the new attempt runs. The paused attempt's
fence refuses every write it still makes: the job succeeds once, with all of its own output and
nothing of the paused attempt's; a paused training leader leaves one model version, not two.
(A pause that falls inside an SQLite write transaction, rare, gets the worker killed by its
launcher: tests/stack/test_supervision.py. The job then runs again all the same.)"""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq
import pytest

from mxq.db import registry
from mxq.db.outputs import results
from mxq.db.outputs.parquet import parts_dir
from mxq.db.outputs.results import output_file
from mxq.db.stack import stack_id
from mxq.workers.jobs.submit import submit
from mxq.workers.launch import procs
from tests.conftest import wait_until
from tests.faults.stacks import FaultStack, report
from tests.support.inference import committed_position

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

pytestmark = [pytest.mark.slow, pytest.mark.both_legs]

SAMPLES = 400_000


def _pause_group(stack: FaultStack, worker: str | None) -> int:
    """SIGSTOP the worker's process group (the worker and a training child): a frozen machine."""
    assert worker is not None
    pid = stack.worker_pid(worker)
    assert pid is not None
    os.killpg(pid, signal.SIGSTOP)
    return pid


def _resume(group: int) -> bool:
    """SIGCONT the paused group; False when it is gone: its launcher killed it because it was
    stopped holding the SQLite write lock (the pause fell inside a write transaction)."""
    try:
        os.killpg(group, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True


def _gone(group: int) -> bool:
    return not procs.group_members(group)


def _handed_on(stack: FaultStack, job_id: int, paused: str | None, group: int) -> JobRecord:
    """Wait until the job runs again in a later attempt: on another worker, or on any once the
    paused one was killed (its restart has the same name)."""
    return wait_until(lambda: stack.job(job_id), 120, f"job {job_id} to be handed on",
                      until=lambda j: j["status"] != "running" or (
                          j["attempts"] >= 2 and (j["worker"] != paused or _gone(group))),
                      interval=0.1)


def _output_once(stack: FaultStack, job: JobRecord) -> pq.Table:
    """The job's Parquet output holds every sample once, in order, and nothing else is left."""
    path = output_file(stack.home, stack_id(stack.settings.database), job["id"], ".parquet")
    time.sleep(3)  # the resumed worker's next write comes (and is refused) within its flush time
    table = pq.read_table(path)
    assert table.column("index").to_pylist() == list(range(SAMPLES))  # once each, in order
    assert results.count(stack.settings.database, stack.home, job) == SAMPLES
    assert not parts_dir(path).exists()  # no stray part of the paused attempt left behind
    assert sorted(p.name for p in path.parent.glob(f"job-{job['id']}.*")) == [path.name]
    return table


def _paused_at_20_percent(stack: FaultStack) -> tuple[int, str | None, int]:
    """A new Parquet job, its worker and that worker's process group, paused once the job
    committed 20 % of its samples and still running. The job's other 80 % take about 0.25 s
    here: one that ends before the pause lands is submitted again, at most twice."""
    for _ in range(3):
        job_id = stack.infer("mlp64", "pause.npy", output="parquet", batch_size=256)
        wait_until(partial(committed_position, stack, job_id), 300,
                   f"job {job_id} to commit 20 %", until=lambda n: n >= 0.2 * SAMPLES,
                   interval=0.02)
        worker = stack.job(job_id)["worker"]
        group = _pause_group(stack, worker)
        if stack.job(job_id)["status"] == "running":
            return job_id, worker, group
        _resume(group)
    raise AssertionError("3 Parquet jobs ended before their worker was paused at 20 %")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("resume_when", ["mid-run", "after"])
def test_a_paused_workers_parquet_job_succeeds_once_with_all_its_output(faulty: FaultStack,
                                                                        resume_when: str) -> None:
    faulty.model()
    faulty.samples("pause.npy", SAMPLES, seed=5)
    job_id, paused, pid = _paused_at_20_percent(faulty)
    try:
        _handed_on(faulty, job_id, paused, pid)
        if resume_when == "after":
            faulty.wait_all([job_id], 300)
    finally:
        resumed = _resume(pid)
    job = faulty.wait_all([job_id], 300)[job_id]
    assert job["status"] == "succeeded", job["error"]
    assert job["attempts"] == 2 and (job["worker"] != paused or not resumed)
    table = _output_once(faulty, job)
    reference = faulty.wait_all([faulty.infer("mlp64", "pause.npy", output="npy")], 300)
    probs = np.load(str(next(iter(reference.values()))["output"]))
    assert np.array_equal(table.column("predicted_class").to_numpy(), probs.argmax(axis=1))
    report("SIGSTOP a worker past its lease (Parquet job)", {
        "backend": faulty.name, "resumed": resume_when, "samples": SAMPLES,
        "rows": table.num_rows, "duplicated": table.num_rows - len(set(table.column("index").to_pylist())),
        "lost": SAMPLES - len(set(table.column("index").to_pylist())), "attempts": job["attempts"],
        "killed holding the SQLite lock": not resumed})


@pytest.mark.timeout(900)
def test_a_paused_training_leader_leaves_one_version(faulty: FaultStack) -> None:
    name = f"paused{faulty.name}"
    job_id = submit(faulty.settings, "train", {"arch": "mlp", "dataset": "digits", "name": name,
                                               "epochs": 30, "val_fraction": 0.1, "seed": 3},
                    "auto", allow_offline=True)
    first = wait_until(lambda: faulty.mxq_json("job", str(job_id)), 300, "three epochs",
                       until=lambda j: len(j.get("epochs") or []) >= 3, interval=0.2)
    paused = first["worker"]
    pid = _pause_group(faulty, paused)
    try:
        _handed_on(faulty, job_id, paused, pid)
        done = faulty.wait_all([job_id], 600)[job_id]
    finally:
        _resume(pid)
    time.sleep(5)  # the paused child's next write is refused; it registers nothing
    assert done["status"] == "succeeded", done["error"]
    versions = registry.list_models(faulty.settings.database, name)
    assert [v["source"] for v in versions] == [f"train:job-{job_id}"]
    resumed = (done["result"] or {})["resumed_from_epoch"]
    assert resumed >= 3
    report("SIGSTOP a training leader past its lease", {
        "backend": faulty.name, "versions": len(versions), "attempts": done["attempts"],
        "resumed_from_epoch": resumed})
