"""Inference jobs as the tests run them: an input saved into the data root, `mxq infer --wait
--json`, the predictions of a direct MXNet run to compare with, and how far a job has stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import select

from mxq.db.engine import session_scope
from mxq.db.schema import Job
from tests.conftest import Stack


def save_npy(stack: Stack, name: str, array: NDArray[Any]) -> Path:
    """`array` saved as data/`name` in the stack's home (its data root)."""
    path = stack.home / "data" / name
    np.save(path, array)
    return path


def predict_directly(stack: Stack, model: str, x: NDArray[Any]) -> NDArray[np.float32]:
    """The probabilities `model` (NAME or NAME:VERSION) gives `x` run by MXNet here, no job."""
    import mxnet as mx

    from mxq.db.registry import resolve
    from mxq.tasks.model_store.models import load

    net, _ = load(stack.settings, resolve(stack.settings.database, model), mx.cpu())
    probabilities: NDArray[np.float32] = mx.nd.softmax(net(mx.nd.array(x))).asnumpy()
    return probabilities


def committed_position(stack: Stack, job_id: int) -> int:
    """Where the job's results are stored up to (the column its flushes move)."""
    with session_scope(stack.settings.database) as session:
        return session.scalar(select(Job.committed).where(Job.id == job_id)) or 0


def infer_and_wait(stack: Stack, *args: str) -> dict[str, Any]:
    """`mxq infer ARGS --wait --json`: the finished job's record (succeeded or failed)."""
    proc = stack.mxq("infer", *args, "--wait", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    record: dict[str, Any] = json.loads(proc.stdout)
    return record
