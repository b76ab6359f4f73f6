"""Retraining schedules as the tests add them: on a fixed clock (`T0`), over fresh datasets in
the data root."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import numpy as np

from mxq.db.records import ScheduleRecord
from mxq.workers.schedules.fires import add_schedule
from tests.conftest import Stack

RETRAINING = {"arch": "mlp", "name": "retrained", "epochs": 1}
T0 = datetime(2026, 3, 27, 12, tzinfo=UTC)


def fresh_dataset(stack: Stack, name: str = "fresh/a.npz", age: float = 0.0) -> str:
    """A small .npz (X, y) under the data root, modified `age` seconds ago; its name."""
    path = stack.home / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, X=np.random.default_rng(0).normal(size=(30, 4)), y=np.arange(30) % 3)
    if age:
        os.utime(path, (path.stat().st_atime - age, path.stat().st_mtime - age))
    return name


def add_retraining(stack: Stack, name: str, cron: str, tz: str = "UTC", dataset: str = "fresh/*.npz",
                   now: datetime = T0) -> ScheduleRecord:
    """A schedule that retrains an MLP on the newest file `dataset` matches, added at `now`."""
    return add_schedule(stack.settings, name, cron, tz, dataset, dict(RETRAINING), "if-better",
                        "val_accuracy", 0.0, now=now)
