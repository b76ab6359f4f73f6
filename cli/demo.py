"""`mxq demo`: the main job on a running stack, with figures that mean something.

It probes every live device of this node, trains a LeNet on scikit-learn's digits through the
training path `mxq train` takes (data-parallel over the live devices of one kind), then runs bulk
inference of that version over the digits on every device and prints, per device, throughput
beside accuracy against the digits' labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mxq.cli import render
from mxq.cli.settings import get_settings
from mxq.json_types import JsonMapping

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from mxq.db.records import JobRecord
    from mxq.workers.settings import Settings

MODEL = "digits-demo"
PROBE = {"size": 512, "batch": 32, "repeat": 3}  # a second or two per device
PROBE_COLUMNS = ["device", "job", "status", "matmul_gflops", "conv_images_per_sec"]
INFER_COLUMNS = ["device", "job", "status", "samples", "seconds", "samples_per_sec", "accuracy"]


def demo_input(s: Settings, copies: int) -> tuple[Path, NDArray[np.int64]]:
    """The digits as stored (pixels 0 to 16, shape N,1,8,8), repeated `copies` times, inside the
    data root, and their labels. The trained version scales them itself (its preprocessing)."""
    import numpy as np
    from sklearn.datasets import load_digits

    root = s.inputs_root
    folder = s.home_path / "demo" if s.home_path.is_relative_to(root) else root / "mxq-demo"
    folder.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    path = folder / f"digits-raw-x{copies}.npy"
    if not path.exists():
        np.save(path, np.tile(digits.images.astype(np.float32)[:, None], (copies, 1, 1, 1)))
    return path, np.tile(digits.target, copies)


def _wait(s: Settings, job_id: int) -> JobRecord:
    """The job's final record, its progress shown meanwhile (with metrics and epochs)."""
    from mxq.db.reports.history import require_job

    render.wait_for(job_id, lambda j: require_job(s.database, j), None)
    return require_job(s.database, job_id, with_metrics=True)


def _trained_version(trained: JobRecord) -> int:
    """The version the demo's training registered, its figures shown; exit 1 if it failed."""
    if trained["status"] != "succeeded":
        render.err.print(f"mxq: training job {trained['id']} {trained['status']}: {trained['error']}",
                         markup=False)
        raise typer.Exit(1)
    version: int = (trained["result"] or {})["model_version"]
    epochs_run = trained.get("epochs") or []
    val = epochs_run[-1].get("val_accuracy") if epochs_run else None
    render.out.print(f"trained {MODEL}:{version} in {trained['seconds'] or 0:.1f} s, "
                     f"{trained['samples_per_sec'] or 0:,.0f} samples/s"
                     + (f", validation accuracy {val:.3f}" if val is not None else ""))
    return version


def _run(s: Settings, kind: str, params: JsonMapping, devices: list[str]) -> list[JobRecord]:
    """One job of `kind` per device, queued at once, each waited for with its progress shown."""
    from mxq.workers.jobs.submit import submit

    return [_wait(s, i) for i in [submit(s, kind, params, d) for d in devices]]


def _train(s: Settings, devices: list[str], epochs: int) -> JobRecord:
    """A LeNet trained on digits over the live devices of the first one's kind (GPUs first)."""
    from mxq.device import Device
    from mxq.workers.jobs.submit import submit

    kind = Device.parse(devices[0]).kind
    group = [d for d in devices if Device.parse(d).kind == kind]
    params: JsonMapping = {"arch": "lenet", "dataset": "digits", "name": MODEL, "devices": len(group),
              "device_list": group, "epochs": epochs, "batch_size": 64, "optimizer": "adam",
              "lr": 0.005}
    render.out.print(f"training {MODEL} (lenet) on digits over {', '.join(group)}, {epochs} epochs")
    return _wait(s, submit(s, "train", params, group[0]))


def _accuracy(s: Settings, record: JobRecord, labels: NDArray[np.int64]) -> float | None:
    """The share of samples whose predicted class is the label (None if the job failed)."""
    import numpy as np

    from mxq.db.outputs.results import recorded_output

    if record["status"] != "succeeded":
        return None
    probabilities = np.load(recorded_output(s.home_path, s.database, record, ".npy"), mmap_mode="r")
    return float((probabilities.argmax(axis=1) == labels).mean())


def _live_devices(s: Settings) -> list[str]:
    from mxq.db.reports.history import device_records

    devices = sorted((d["device"] for d in device_records(s.database, s.heartbeat_ttl)
                      if d["alive"] and d["node"] == s.node), key=lambda d: (d[:3] != "gpu", d))
    if not devices:
        render.err.print("mxq: no live device: run `mxq up --detach` first", markup=False)
        raise typer.Exit(1)
    return devices


def demo(copies: Annotated[int, typer.Option(min=1, max=1000, help="Repeat the 1,797 digits this often for inference.")] = 20,  # noqa: E501
         epochs: Annotated[int, typer.Option(min=1, max=100, help="Training epochs over the digits.")] = 8) -> None:  # noqa: E501
    """Probe every live device, train a LeNet on digits, infer with it on every device: accuracy
    and throughput per device."""
    s = get_settings()
    devices = _live_devices(s)
    probes = _run(s, "probe", PROBE, devices)
    render.table([{**(r["result"] or {}), **r, "job": r["id"], "device": d}
                  for d, r in zip(devices, probes, strict=True)], PROBE_COLUMNS, "probe per device")
    version = _trained_version(_train(s, devices, epochs))
    data, labels = demo_input(s, copies)
    render.out.print(f"bulk inference of {MODEL}:{version} over {data} ({len(labels):,} samples) "
                     f"on {', '.join(devices)}")
    runs = _run(s, "infer", {"model": f"{MODEL}:{version}", "input": str(data), "batch_size": 256,
                             "output": "npy"}, devices)
    rows = [{**r, "job": r["id"], "device": d, "accuracy": _accuracy(s, r, labels)}
            for d, r in zip(devices, runs, strict=True)]
    render.table(rows, INFER_COLUMNS, "bulk inference per device (accuracy against the labels)")
    if any(r["status"] != "succeeded" for r in [*probes, *runs]):
        raise typer.Exit(1)
