"""`mxq demo`: the main job on a running stack: bulk inference over scikit-learn's digits on
every live device, then per-device throughput."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from mxq.cli import render
from mxq.db.history import device_records, require_job
from mxq.db.records import ModelRecord
from mxq.db.registry import ModelNotFound, resolve
from mxq.workers.settings import Settings, get_settings
from mxq.workers.submit import submit

MODEL = "digits-demo"
COLUMNS = ["device", "job", "status", "samples", "seconds", "samples_per_sec"]


def demo_input(s: Settings, copies: int) -> Path:
    """Digits images (N, 1, 8, 8), repeated `copies` times, inside the data root."""
    from sklearn.datasets import load_digits

    root = s.inputs_root
    folder = s.home_path / "demo" if s.home_path.is_relative_to(root) else root / "mxq-demo"
    folder.mkdir(parents=True, exist_ok=True)
    images = load_digits().images.astype(np.float32)[:, None] / 16.0
    path = folder / f"digits-x{copies}.npy"
    if not path.exists():
        np.save(path, np.tile(images, (copies, 1, 1, 1)))
    return path


def demo_model(s: Settings) -> ModelRecord:
    try:
        return resolve(s.database, MODEL)
    except ModelNotFound:
        from mxq.tasks.models import add_builtin  # loads MXNet, only here

        return add_builtin(s.database, s.home_path, MODEL, "lenet", (1, 8, 8), 10)


def demo(copies: Annotated[int, typer.Option(help="Repeat the 1,797 digits this often.")] = 20) -> None:
    """Register a LeNet for digits, infer over digits on every live device, show throughput."""
    s = get_settings()
    devices = [d["device"] for d in device_records(s.database, s.heartbeat_ttl)
               if d["alive"] and d["node"] == s.node]
    if not devices:
        render.err.print("mxq: no live device: run `mxq up --detach` first", markup=False)
        raise typer.Exit(1)
    model, data = demo_model(s), demo_input(s, copies)
    render.out.print(f"model {model['name']}:{model['version']}, input {data} "
                     f"({copies * 1797:,} samples), devices {', '.join(devices)}")
    ids = {d: submit(s, "infer", {"model": MODEL, "input": str(data), "batch_size": 256}, d)
           for d in devices}
    rows = []
    for device, job_id in ids.items():
        record = render.wait_for(job_id, lambda i: require_job(s.database, i), None)
        rows.append({**record, "job": job_id, "device": device})
    render.table(rows, COLUMNS, "bulk inference per device")
    if any(r["status"] != "succeeded" for r in rows):
        raise typer.Exit(1)
