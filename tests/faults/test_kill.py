"""SIGKILL device workers at random points of real inference and training jobs: every job ends
succeeded, every prediction row exists exactly once, and training resumes from checkpoints."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from mxq.db import events
from mxq.db.outputs.epochs import list_epochs
from mxq.db.outputs.parquet import parts_dir
from mxq.db.outputs.results import output_file
from mxq.db.stack import stack_id
from mxq.tasks.inference.infer import flush_rows, read_size
from mxq.workers.jobs.submit import submit
from tests.conftest import wait_until
from tests.faults.stacks import FEATURES, FaultStack, _zombie_or_gone, report
from tests.support.inference import committed_position

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

# Claims and prediction writes under SIGKILL differ by backend: both legs.
pytestmark = [pytest.mark.slow, pytest.mark.both_legs]

KILLS = 6  # over 3 jobs at least: each kill costs a worker's restart (the suite's minutes)
INFER_SAMPLES = 400_000
TRAIN_EPOCHS = 30


def _running_unkilled(stack: FaultStack, ids: list[int], killed: dict[int, int],
                      max_kills: int) -> JobRecord | None:
    """A job running in an attempt not yet killed, on a live worker."""
    for job_id, status in stack.statuses(ids).items():
        if status == "running" and killed.get(job_id, 0) < max_kills:
            job = stack.job(job_id)
            if job["attempts"] > killed.get(job_id, 0) and job["worker"] and \
                    stack.worker_pid(job["worker"]):
                return job
    return None


def _frozen(stack: FaultStack, job: JobRecord, ready: Callable[[JobRecord], bool]) -> int | None:
    """SIGSTOP the worker running `job`; its pid when, with the worker frozen, the job still runs
    in the same attempt and `ready` still accepts it, else None (the worker goes on).

    An inference job of this file lasts a fraction of a second: killed while merely read as
    running, its worker could have finished it between the read and the signal (an uncounted
    kill, the job's one attempt). Frozen, the job's record and committed position are where the
    kill finds them."""
    pid = stack.signal_worker(str(job["worker"]), signal.SIGSTOP)
    if pid is None:
        return None
    now = stack.job(job["id"])
    if now["status"] == "running" and now["attempts"] == job["attempts"] and \
            now["worker"] == job["worker"] and ready(now):
        return pid
    os.kill(pid, signal.SIGCONT)
    return None


def _kill_when(stack: FaultStack, ids: list[int], killed: dict[int, int], max_kills: int,
               ready: Callable[[JobRecord], bool], top_up: Callable[[], int] | None = None) -> JobRecord:
    """Wait for a running job that `ready` accepts, then SIGKILL its worker (frozen first).

    `top_up` adds a job to `ids` when none is left that could still be killed."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = stack.statuses(ids)
        if top_up and not [i for i, v in states.items()
                           if v in ("queued", "running") and killed.get(i, 0) < max_kills]:
            ids.append(top_up())
        job = _running_unkilled(stack, ids, killed, max_kills)
        pid = None if job is None or not ready(job) else _frozen(stack, job, ready)
        if job is not None and pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed[job["id"]] = killed.get(job["id"], 0) + 1
            return job
        time.sleep(0.05)
    raise AssertionError(f"no job to kill in 300s: {stack.statuses(ids)}")


@pytest.mark.timeout(1200)
def test_sigkill_mid_inference(faulty: FaultStack) -> None:
    rng = random.Random(7)
    faulty.model()
    faulty.samples("kill.npy", INFER_SAMPLES)

    def top_up() -> int:
        return faulty.infer("mlp64", "kill.npy")

    ids = [top_up() for _ in range(3)]
    killed: dict[int, int] = {}
    points = []
    for _ in range(KILLS):
        target = rng.uniform(0.0, 0.8)
        # Never near the end: a job read as running at 100 % may finish before the signal lands,
        # and the SIGKILL would hit the worker's next job, uncounted.
        # By its committed position (moved every flush), not its progress (written every 2 s):
        # a fast engine can run a whole job between two progress writes.
        def ready(j: JobRecord, t: float = target) -> bool:
            return t <= committed_position(faulty, j["id"]) / INFER_SAMPLES < 0.9

        job = _kill_when(faulty, ids, killed, 1, ready, top_up)
        points.append(round(committed_position(faulty, job["id"]) / INFER_SAMPLES, 2))
    done = faulty.wait_all(ids, timeout=900)

    reference = None
    missing = duplicated = 0
    for job_id, job in done.items():
        assert job["status"] == "succeeded", (job_id, job["error"])
        index, classes = faulty.predicted(job_id)
        missing += INFER_SAMPLES - len(np.unique(index))
        duplicated += len(index) - len(np.unique(index))
        assert np.array_equal(index, np.arange(INFER_SAMPLES))
        reference = classes if reference is None else reference
        assert np.array_equal(classes, reference), f"job {job_id} predicted other classes"
    assert sum(killed.values()) == KILLS
    for job_id in killed:
        assert done[job_id]["attempts"] == 2  # killed once, then run to the end
        kinds = [e["kind"] for e in events.list_events(faulty.settings.database, job_id)]
        assert events.REQUEUED in kinds
        resumed = (done[job_id]["result"] or {})["resumed_from"]
        assert (events.RESUMED in kinds) == (resumed is not None)
        assert done[job_id]["samples"] == INFER_SAMPLES  # every sample its output holds
    report("SIGKILL mid-inference", {"backend": faulty.name, "trials": KILLS, "jobs": len(ids),
                                     "finished": len(done), "rows_lost": missing,
                                     "rows_duplicated": duplicated, "kill_progress": points})


def _computed_rows(path: str) -> int:
    """How many leading rows of a job's .npy hold probabilities (the file starts as zeros, and
    a worker fills it in index order): what the worker had computed when it died."""
    filled = np.load(path, mmap_mode="r").any(axis=1)
    return int(filled.argmin()) if not filled.all() else len(filled)


def _kill_and_read(stack: FaultStack, pid: int, job_id: int, output: str) -> int | None:
    """SIGKILL the job's frozen worker `pid`; how far it had computed (from its .npy, for npy
    outputs).

    The launcher is held (SIGSTOP) until the .npy is read, so no new attempt, which would write
    the same rows from the resume point on, can have started: the figure is the dead attempt's."""
    assert stack.launcher is not None
    os.kill(stack.launcher.pid, signal.SIGSTOP)
    try:
        os.kill(pid, signal.SIGKILL)
        while not _zombie_or_gone(pid):
            time.sleep(0.01)
        if output not in ("npy", "both"):
            return None
        return _computed_rows(str(output_file(stack.home, stack_id(stack.settings.database), job_id,
                                              ".npy")))
    finally:
        os.kill(stack.launcher.pid, signal.SIGCONT)


def _frozen_at_60_percent(stack: FaultStack, output: str, model: str = "mlp64",
                          **params: str) -> tuple[int, int]:
    """A new job for `output` and its worker's pid, the worker frozen once the job committed 60 %
    of its samples. A job that ends before the freeze (its last 40 % take about 0.1 s here) is
    submitted again, at most twice."""
    for _ in range(3):
        job_id = stack.infer(model, "resume.npy", output=output, batch_size=512, **params)
        wait_until_committed = time.monotonic() + 300
        while committed_position(stack, job_id) < 0.6 * INFER_SAMPLES:
            assert time.monotonic() < wait_until_committed, stack.job(job_id)
            time.sleep(0.01)
        pid = _frozen(stack, stack.job(job_id), lambda j: True)
        if pid is not None:
            return job_id, pid
    raise AssertionError(f"3 jobs to {output} ended before their worker was frozen at 60 %")


@pytest.mark.timeout(900)
def test_sigkill_at_60_percent_resumes_for_each_output_kind(faulty: FaultStack) -> None:
    """One SIGKILL at about 60 % of a large unchunked job, for each output kind: the next attempt
    starts after the last committed sample, and the predictions equal an uninterrupted run."""
    faulty.model()
    faulty.samples("resume.npy", INFER_SAMPLES, seed=3)
    whole = faulty.wait_all([faulty.infer("mlp64", "resume.npy", output="both")], 300)
    reference = np.load(str(next(iter(whole.values()))["output"]))
    figures = {}
    for output in ("db", "npy", "parquet", "both"):
        job_id, pid = _frozen_at_60_percent(faulty, output)
        at_kill = committed_position(faulty, job_id)
        computed = _kill_and_read(faulty, pid, job_id, output)
        job = faulty.wait_all([job_id], 300)[job_id]
        assert job["status"] == "succeeded", job["error"]
        assert job["attempts"] == 2
        resumed = (job["result"] or {})["resumed_from"]
        assert resumed is not None and resumed >= at_kill
        assert job["samples"] == INFER_SAMPLES  # every sample its output holds, both attempts'
        kinds = [e for e in events.list_events(faulty.settings.database, job_id)
                 if e["kind"] == events.RESUMED]
        assert [(e["data"] or {})["position"] for e in kinds] == [resumed]
        # Measured where the killed attempt's work is visible (the .npy it filled as it went).
        total = None if computed is None else computed + INFER_SAMPLES - resumed
        if computed is not None:  # what the killed attempt computed and did not commit, exactly:
            # at most the flush being stored and the one being computed (of flush_rows + a read,
            # the largest one: a batch timed as instant)
            most = flush_rows(output != "npy", 10, INFER_SAMPLES) + read_size(512, (FEATURES,), 1e-9)
            assert 0 <= computed - resumed <= 2 * most
        _check_predictions(faulty, job, output, reference)
        figures[output] = {"killed_at": round(at_kill / INFER_SAMPLES, 3),
                           "resumed_from": resumed, "computed_total": total,
                           "recomputed": None if total is None else total - INFER_SAMPLES}
    report("SIGKILL at 60 %, resumed", {"backend": faulty.name, "samples": INFER_SAMPLES,
                                        "flush_rows": {o: flush_rows(o != "npy", 10, INFER_SAMPLES)
                                                       for o in figures}, **figures})


def _exported(stack: FaultStack, name: str, net: object, outputs: str) -> np.ndarray:
    """A user's net of 64 inputs, registered as `name` with `--outputs`; its outputs on the
    stack's resume.npy as a job stores them (several heads side by side), run by plain MXNet."""
    import mxnet as mx

    mx.random.seed(5)
    block: Any = net
    block.initialize(mx.init.Xavier())
    block.hybridize()
    block(mx.nd.zeros((1, FEATURES)))
    block.export(str(stack.home / name))
    proc = stack.mxq("models", "add", name, "--symbol", str(stack.home / f"{name}-symbol.json"),
                     "--params", str(stack.home / f"{name}-0000.params"), "--input-shape",
                     str(FEATURES), "--outputs", outputs)
    assert proc.returncode == 0, proc.stderr
    out = block(mx.nd.array(np.load(stack.home / "data" / "resume.npy")))
    values: np.ndarray = (np.concatenate([mx.nd.softmax(out[0]).asnumpy(), out[1].asnumpy()], axis=1)
                          if isinstance(out, list | tuple) else out.asnumpy())
    return values


def _sequential(*blocks: object) -> object:
    import mxnet as mx

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(32, activation="tanh"), *blocks)
    return net


def _two_heads() -> object:
    """A class (5 logits) and a box (4 values) from one body."""
    import mxnet as mx

    class TwoHeads(mx.gluon.HybridBlock):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.cls, self.box = (mx.gluon.nn.Dense(32, activation="tanh"),
                                             mx.gluon.nn.Dense(5), mx.gluon.nn.Dense(4))

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            h = self.body(x)
            return self.cls(h), self.box(h)

    return TwoHeads()


@pytest.mark.timeout(900)
def test_sigkill_at_60_percent_resumes_models_that_are_not_classifiers(faulty: FaultStack) -> None:
    """An embedding to .npy, multi-label tags to SQL rows and Parquet, a two-headed model to an
    .npy per head and Parquet columns: one SIGKILL at about 60 % each, and every sample's values
    are stored once, equal to plain MXNet's (an embedding's Parquet resume is a classifier's:
    `test_sigkill_at_60_percent_resumes_for_each_output_kind`)."""
    import mxnet as mx

    faulty.samples("resume.npy", INFER_SAMPLES, seed=4)
    embedding = _exported(faulty, "killemb", _sequential(), "embedding")
    tags = _exported(faulty, "killtags", _sequential(mx.gluon.nn.Dense(6), mx.gluon.nn.Activation("sigmoid")),
                     "multilabel")
    heads = _exported(faulty, "killheads", _two_heads(), "cls=logits,box=regression")
    for model, output, reference in [("killemb", "npy", embedding), ("killtags", "db", tags),
                                     ("killtags", "parquet", tags), ("killheads", "npy", heads),
                                     ("killheads", "parquet", heads)]:
        job_id, pid = _frozen_at_60_percent(faulty, output, model, engine="mxnet")
        at_kill = committed_position(faulty, job_id)
        _kill_and_read(faulty, pid, job_id, "db")
        job = faulty.wait_all([job_id], 300)[job_id]
        assert job["status"] == "succeeded", job["error"]
        assert job["attempts"] == 2 and (job["result"] or {})["resumed_from"] >= at_kill
        if model == "killheads":
            _check_heads(job, output, reference)
        else:
            _check_values(faulty, job, output, reference)


def _check_heads(job: JobRecord, output: str, reference: np.ndarray) -> None:
    """Both heads' values of every sample stored once: cls (5) then box (4)."""
    cls, box = reference[:, :5], reference[:, 5:]
    if output == "npy":
        files = (job["result"] or {})["output_files"]
        np.testing.assert_allclose(np.load(files["cls"]), cls, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.load(files["box"]), box, rtol=1e-5, atol=1e-5)
        return
    table = pq.read_table(str(job["output"]))
    assert table.column("index").to_pylist() == list(range(INFER_SAMPLES))
    assert np.array_equal(table.column("cls_class").to_numpy(), cls.argmax(axis=1))
    np.testing.assert_allclose(np.stack(table.column("box").to_numpy(zero_copy_only=False)), box,
                               rtol=1e-5, atol=1e-5)


def _check_values(stack: FaultStack, job: JobRecord, output: str, reference: np.ndarray) -> None:
    """Every sample's values (or labels kept at 0.5) stored once, equal to plain MXNet's."""
    labels = [[int(c) for c in np.argsort(-r, kind="stable") if r[c] >= 0.5] for r in reference]
    if output == "npy":
        np.testing.assert_allclose(np.load(str(job["output"])), reference, rtol=1e-5, atol=1e-6)
    elif output == "db":
        index, stored = stack.predicted(job["id"])
        assert np.array_equal(index, np.arange(INFER_SAMPLES))
        assert np.array_equal(stored, reference.argmax(axis=1))
    else:
        table = pq.read_table(str(job["output"]))
        assert table.column("index").to_pylist() == list(range(INFER_SAMPLES))
        stored = np.stack(table.column("output").to_numpy(zero_copy_only=False))
        np.testing.assert_allclose(stored, reference, rtol=1e-5, atol=1e-6)
        if "labels" in table.column_names:
            assert table.column("labels").to_pylist() == labels


def _check_predictions(stack: FaultStack, job: JobRecord, output: str, reference: np.ndarray) -> None:
    """Every sample stored once, equal to the uninterrupted run."""
    classes = reference.argmax(axis=1)
    if output in ("db", "both"):
        index, stored = stack.predicted(job["id"])
        assert np.array_equal(index, np.arange(INFER_SAMPLES))
        assert np.array_equal(stored, classes)
    if output in ("npy", "both"):
        np.testing.assert_allclose(np.load(str(job["output"])), reference, rtol=1e-5, atol=1e-7)
    if output == "parquet":
        path = output_file(stack.home, stack_id(stack.settings.database), job["id"], ".parquet")
        table = pq.read_table(path)
        assert table.column("index").to_pylist() == list(range(INFER_SAMPLES))
        assert np.array_equal(table.column("predicted_class").to_numpy(), classes)
        assert not parts_dir(path).exists()


@pytest.mark.timeout(1200)
def test_sigkill_mid_training(faulty: FaultStack) -> None:
    rng = random.Random(11)
    s = faulty.settings
    # Kills per job, under the 5-attempt cap: a job killed twice on one device, one killed once on
    # two (each kill costs a worker's restart and a re-read of the checkpoint: the test's minutes).
    plan = [2, 1]
    killed: dict[int, int] = {}
    at_epochs, ids = [], []
    for i, kills in enumerate(plan):  # one job at a time, so none ends before its kills
        job_id = submit(s, "train", {"arch": "mlp", "dataset": "digits", "name": f"killed{i}",
                                     "devices": 1 + i % 2, "epochs": TRAIN_EPOCHS,
                                     "val_fraction": 0.1, "seed": i}, "auto", allow_offline=True)
        ids.append(job_id)
        for target in sorted(rng.sample(range(2, TRAIN_EPOCHS - 5), kills)):
            def ready(job: JobRecord, t: int = target, j: int = job_id) -> bool:
                return job["id"] == j and len(list_epochs(s.database, j)) >= t

            _kill_when(faulty, [job_id], killed, kills, ready)
            at_epochs.append(target)
    done = faulty.wait_all(ids, timeout=900)
    for job_id, kills in zip(ids, plan, strict=True):
        job = done[job_id]
        assert job["status"] == "succeeded", (job_id, job["error"])
        assert job["attempts"] == kills + 1
        assert (job["result"] or {})["resumed_from_epoch"] >= 1
        detail = faulty.mxq_json("job", str(job_id))
        assert [e["epoch"] for e in detail["epochs"]] == list(range(1, TRAIN_EPOCHS + 1))
        assert detail["epochs"][-1]["val_accuracy"] >= 0.85
    # The last killed worker may still be restarting (the launcher backs off after repeated
    # kills) when the jobs have finished on the other device: both come back, no lease held.
    free = wait_until(lambda: [d for d in faulty.mxq_json("devices") if d["alive"]], 120,
                      "both workers to be back", until=lambda alive: len(alive) == 2)
    assert all(d["leased_by"] is None for d in free)
    report("SIGKILL mid-training", {"backend": faulty.name, "trials": sum(plan), "jobs": len(ids),
                                    "finished": len(done), "rows_lost": 0, "rows_duplicated": 0,
                                    "kill_epochs": at_epochs})
