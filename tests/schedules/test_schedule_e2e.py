"""A schedule fires through real workers: it trains on the newest file of a folder, promotes a
better model, keeps the promoted one against a worse or failed retraining, all recorded in SQL."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

import numpy as np
import pytest

from mxq.db import schedules
from mxq.db.records import FireRecord
from mxq.db.registry import list_models
from mxq.tasks.training import datasets
from mxq.workers.schedules.fires import add_schedule, tick
from tests.conftest import Stack, wait_until


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
