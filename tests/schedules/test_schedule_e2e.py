"""A schedule fires through real workers: it trains on the newest file of a folder, promotes a
better model, keeps the promoted one against a worse or failed retraining, all recorded in SQL;
and it retrains a user's own model from a bucket glob through a kill of its worker."""

from __future__ import annotations

import io
import os
import signal
import time
from datetime import datetime, timedelta

import numpy as np
import pytest

from mxq.db import schedules
from mxq.db.outputs.epochs import list_epochs
from mxq.db.records import FireRecord
from mxq.db.registry import list_models
from mxq.tasks.training import datasets
from mxq.workers.schedules.fires import add_schedule, tick
from tests.conftest import Stack, wait_until
from tests.support.s3 import S3Server
from tests.support.workers import pid_of, wait_alive
from tests.training.test_retrain import trained_and_exported


def _drop(stack: Stack, name: str, shuffle_labels: bool = False, corrupt: bool = False) -> None:
    """A new, newest file in the watched folder."""
    folder = stack.home / "data" / "nightly"
    folder.mkdir(exist_ok=True)
    path = folder / name
    if corrupt:
        path.write_bytes(b"not a zip archive")
    else:
        d = datasets.digits().for_training()  # a file dataset is trained on as stored
        y = d.y.copy()
        if shuffle_labels:  # in the samples it trains on; its validation samples (seed 0) stay right
            n_val = int(round(len(y) * 0.2))
            train = np.random.default_rng(0).permutation(len(y))[:-n_val]
            y[train] = np.random.default_rng(1).permutation(y[train])
        np.savez(path, X=d.x.reshape(len(d.y), -1), y=y)
    stamp = time.time() + len(list(folder.iterdir()))  # strictly newer than the files before it
    os.utime(path, (stamp, stamp))


def _fire(stack: Stack, at: datetime) -> FireRecord:
    assert len(tick(stack.settings, at)) == 1
    return wait_until(lambda: next(f for f in schedules.fires(stack.settings.database, "nightly")
                                   if f["fire_time"] == at.isoformat()),
                      300, f"the fire at {at.isoformat()} to finish its job",
                      # the decision is made before success
                      until=lambda fire: fire["job_status"] in ("succeeded", "failed"), interval=0.2)


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_scheduled_retraining_promotes_only_a_better_model(workers: Stack) -> None:
    s = workers.settings
    spec = {"arch": "mlp", "name": "nightly-model", "epochs": 4, "devices": 2, "seed": 0}
    sched = add_schedule(s, "nightly", "0 3 * * *", "Europe/Berlin", "nightly", spec, "if-better",
                         "val_accuracy", 0.0)
    assert sched["next_fire_at"] is not None
    at = datetime.fromisoformat(sched["next_fire_at"])  # the clock jumps to each fire time

    _drop(workers, "day1.npz")
    good = _fire(workers, at)
    promoted = good["promotion"]
    assert good["job_status"] == "succeeded" and (good["dataset_file"] or "").endswith("day1.npz")
    assert promoted is not None and promoted["decision"] == "promoted"
    assert promoted["reason"] == "no promoted version to compare with"

    _drop(workers, "day2.npz", shuffle_labels=True)  # labels scrambled: a worse model
    worse = _fire(workers, at + timedelta(days=1))
    assert (worse["dataset_file"] or "").endswith("day2.npz") and worse["job_status"] == "succeeded"
    decision = worse["promotion"]
    assert decision is not None and decision["decision"] == "kept"
    # Both judged on day 2's held-out samples: version 1 is measured again there.
    assert decision["promoted_value_from"] == "this validation split"
    assert decision["new_value"] < 0.5 < decision["promoted_value"]
    assert "<" in decision["reason"]

    _drop(workers, "day3.npz", corrupt=True)  # a retraining that fails
    failed = _fire(workers, at + timedelta(days=2))
    assert failed["job_status"] == "failed" and failed["promotion"] is None

    versions = list_models(s.database, "nightly-model")
    assert [(v["version"], v["promoted"]) for v in versions] == [(1, True), (2, False)]
    shown = workers.mxq_json("schedule", "show", "nightly")
    assert [f["job_status"] for f in shown["fires"]] == ["succeeded", "succeeded", "failed"]
    assert {"fire_time", "dataset_file", "job_id", "job_status", "promotion"} <= set(shown["fires"][0])


def _put_digits(name: str, n: int) -> str:
    """Raw digits pixels (0..16), the first `n` samples, as an .npz object (X, y) in the bucket."""
    digits, buf = datasets.digits(), io.BytesIO()
    np.savez(buf, X=digits.x[:n], y=digits.y[:n])
    return S3Server.shared().put(f"in/usercnn-nightly/{name}", buf.getvalue())


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_a_nightly_retraining_of_a_users_model_from_a_bucket_survives_a_kill(workers: Stack) -> None:
    """A user's own CNN, registered from its files with --scale 1/16, retrained by a schedule
    --from it on raw pixels in a bucket: its worker killed mid-epoch, the job resumes from its
    last checkpoint, registers exactly one version, with the stored scaling, and the fire's
    promotion decision is recorded."""
    # the user's usercnn, by another name: test_retrain.py's usercnn shares the session's stack
    symbol, params = trained_and_exported(workers.home / "data", "nightlycnn")
    added = workers.mxq("models", "add", "nightlycnn", "--symbol", str(symbol), "--params", str(params),
                        "--input-shape", "1,8,8", "--scale", "1/16")
    assert added.returncode == 0, added.stderr
    _put_digits("day1.npz", 400)
    newest = _put_digits("day2.npz", len(datasets.digits().y))  # newer, or as new and named later
    added = workers.mxq("schedule", "add", "usercnn-nightly", "--from", "nightlycnn", "--model",
                        "nightlycnn", "--dataset", "s3://mxq-tests/in/usercnn-nightly/*.npz",
                        "--cron", "0 3 * * *", "--epochs", "12", "--promote", "if-better")
    assert added.returncode == 0, added.stderr
    try:
        fire = workers.mxq_json("schedule", "run-now", "usercnn-nightly")
        assert fire["error"] is None and fire["dataset_file"] == newest, fire
        job_id = fire["job_id"]
        wait_until(lambda: list_epochs(workers.settings.database, job_id), 300,
                   f"job {job_id} to record its first epoch", interval=0.05)
        leader = workers.job(job_id)["worker"]
        pid = pid_of(workers, leader)
        os.kill(pid, signal.SIGKILL)  # mid-epoch: the next epoch has begun
        wait_alive(workers, leader, pid)
        done = workers.wait(job_id, timeout=600)
        assert done["status"] == "succeeded", done["error"]
        assert done["attempts"] == 2 and (done["params"] or {})["from_version"] == 1
        result = done["result"] or {}
        assert result["resumed_from_epoch"] >= 1 and result["model_version"] == 2, result
        epochs = list_epochs(workers.settings.database, job_id)
        assert [e["epoch"] for e in epochs] == list(range(1, 13))
        v1, v2 = list_models(workers.settings.database, "nightlycnn")  # exactly one version registered
        assert v2["version"] == 2 and v2["source"] == f"train:job-{job_id} from nightlycnn:1"
        assert v2["preprocess"]["scale"] == v1["preprocess"]["scale"] == 1 / 16
        assert v2["metrics"]["val_accuracy"] >= 0.9, v2["metrics"]  # raw pixels would not reach it
        shown = workers.mxq_json("schedule", "show", "usercnn-nightly")
        (fired,) = shown["fires"]
        decision = fired["promotion"]
        assert fired["job_status"] == "succeeded" and decision == result["promotion"], fired
        assert decision["new_version"] == 2 and decision["promoted_version"] in (None, 1), decision
        old = decision["promoted_value"]  # none: v1 was added, never promoted, and has no metrics
        assert decision["decision"] == ("promoted" if old is None or v2["metrics"]["val_accuracy"] >= old
                                        else "kept"), decision
        assert v2["promoted"] == (decision["decision"] == "promoted")
    finally:
        workers.mxq("schedule", "rm", "usercnn-nightly")
