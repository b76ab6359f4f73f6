"""The training child process: `python -m tasks.trainer JOB_ID DEVICES`.

Started by the job's leader worker with exactly the leased devices visible; trains, checkpoints
each epoch, resumes from the last checkpoint of an earlier attempt, and registers the model.
Its outcome goes to the run file the leader reads; exit 3 means bad input.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import mxnet as mx

from db import epochs as epoch_rows
from db import jobs, registry, schedules
from db.engine import session_scope
from db.schema import Job
from tasks import datasets
from tasks.fit import EpochResult, fit, make_net, make_trainer
from tasks.inputs import InputError
from tasks.models import add_trained
from tasks.train import CHILD_CANCELLED, CHILD_INPUT_ERROR, run_file
from tasks.zoo import ArchError, check_shape
from workers.jobspecs import TrainParams
from workers.paths import PathError, inside_root
from workers.settings import get_settings

PROGRESS_SECONDS = 1.0


class Cancelled(Exception):
    """The job was cancelled; raised at a batch boundary."""


class BadInput(Exception):
    """A dataset or architecture problem, reported as the job's error."""


def load_data(p: TrainParams, url: str) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    s = get_settings()
    try:
        path = p.dataset if p.dataset in datasets.BUILTIN else inside_root(p.dataset, s.data_root,
                                                                             "dataset")
        shape = tuple(p.input_shape) if p.input_shape else None
        ds = datasets.load(path, shape, p.label_column)
        check_shape(p.arch, ds.sample_shape)
    except (InputError, PathError, ArchError) as exc:
        raise BadInput(str(exc)) from None
    known = registry.list_models(url, p.name)
    if known and ds.classes > known[-1]["classes"]:
        raise BadInput(f"dataset {p.dataset} has labels up to {ds.classes - 1} but model {p.name} "
                       f"has {known[-1]['classes']} classes (0..{known[-1]['classes'] - 1})")
    return datasets.split(ds, p.val_fraction, p.seed)


def checkpoint_dir(job_id: int) -> Path:
    return get_settings().home_path / "checkpoints" / f"job-{job_id}"


def resume(url: str, job_id: int, net: Any, trainer: Any, ctxs: list[mx.Context]) -> int:
    """The last epoch an earlier attempt finished and checkpointed (0: none), loaded into net."""
    for e in reversed(epoch_rows.list_epochs(url, job_id)):
        params, states = Path(f"{e['checkpoint']}.params"), Path(f"{e['checkpoint']}.states")
        if params.exists() and states.exists():
            net.load_parameters(str(params), ctx=ctxs)
            trainer.load_states(str(states))
            return e["epoch"]
    return 0


def main(job_id: int, devices: list[str]) -> int:
    s = get_settings()
    url = s.database
    with session_scope(url) as session:
        p = TrainParams(**session.get(Job, job_id).params)
    out = run_file(s, job_id)
    try:
        train, val = load_data(p, url)
    except BadInput as exc:
        out.write_text(json.dumps({"error": str(exc)}))
        return CHILD_INPUT_ERROR
    on_gpu = devices[0].startswith("gpu")
    ctxs = [mx.gpu(i) if on_gpu else mx.cpu(i) for i in range(len(devices))]
    net = make_net(p, train.classes, train.sample_shape, ctxs)
    trainer = make_trainer(p, net, on_gpu)
    done = resume(url, job_id, net, trainer, ctxs)
    folder = checkpoint_dir(job_id)
    folder.mkdir(parents=True, exist_ok=True)
    last_report = [0.0]

    def on_batch(epoch: int, fraction: float) -> None:
        now = time.monotonic()
        if now - last_report[0] >= PROGRESS_SECONDS:
            jobs.set_progress(url, job_id, (epoch - 1 + fraction) / p.epochs)
            last_report[0] = now
            if jobs.cancel_requested(url, job_id):
                raise Cancelled

    def on_epoch(r: EpochResult) -> None:
        prefix = folder / f"epoch-{r.epoch:04d}"
        net.save_parameters(f"{prefix}.params")
        trainer.save_states(f"{prefix}.states")
        epoch_rows.record(url, job_id, {**r.__dict__, "checkpoint": str(prefix)})
        jobs.set_progress(url, job_id, r.epoch / p.epochs)

    try:
        results = fit(p, train, val, ctxs, devices, net, trainer, done + 1, on_batch, on_epoch)
    except Cancelled:  # checkpoints of finished epochs stay
        kept = epoch_rows.list_epochs(url, job_id)
        out.write_text(json.dumps({"samples": len(train.y) * (len(kept) - done)}))
        return CHILD_CANCELLED
    final = epoch_rows.list_epochs(url, job_id)[-1]
    metrics = {"val_accuracy": final["val_accuracy"], "train_accuracy": final["train_accuracy"],
               "train_loss": final["train_loss"], "epochs": p.epochs}
    model = add_trained(url, s.home_path, p.name, net, p.arch, train.sample_shape, train.classes,
                        metrics, job_id)
    promotion = None
    if p.fire_id is not None:  # a scheduled retraining: promote by the schedule's policy
        promotion = schedules.decide_promotion(url, p.fire_id, p.name, model["version"], metrics)
    out.write_text(json.dumps({
        "samples": len(train.y) * len(results), "seconds": sum(r.seconds for r in results),
        "result": {"model": p.name, "model_version": model["version"], "resumed_from_epoch": done,
                   "devices": devices, "promotion": promotion, **metrics},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2].split(",")))
