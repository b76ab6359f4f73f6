"""`register`: add a model version on a device worker, for a process that cannot load MXNet.

`mxq models add` runs the registration itself wherever MXNet loads. Where it does not (the
compose `api` container has the GPU build but no GPU and no driver; a host with only the
gpu-onnx extra), it stages the files under `$MXQ_HOME/staging` and queues this job, which a
worker whose device MXNet runs takes: the same checks, trial runs, ONNX export and checksums as
a local registration, on a machine that can do them. The staged files are read only from that
folder (a message is never trusted with a path) and removed once the job is over.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pydantic import ValidationError

from mxq.preprocess import Preprocess, PreprocessError
from mxq.tasks.models import ModelError, add_builtin, add_exported
from mxq.tasks.runner import JobContext, JobInputError, Outcome, job_task
from mxq.workers.jobspecs import ParamsError, RegisterParams
from mxq.workers.settings import get_settings

STAGING = "staging"


def staged(home: Path, value: str) -> Path:
    """A staged file's path, refused unless it lies in `$MXQ_HOME/staging`."""
    root = (home / STAGING).resolve()
    path = Path(value).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise JobInputError(f"{value!r} is not a file staged under {root}")
    return path


@job_task("register")
def register(job: JobContext) -> Outcome:
    s = get_settings()
    try:
        p = RegisterParams(**job.params)
    except (ValidationError, ParamsError) as exc:
        raise JobInputError(f"invalid register parameters: {exc}") from None
    started = time.perf_counter()
    prep = Preprocess.from_dict(p.preprocess)
    shape = tuple(p.input_shape) if p.input_shape else None
    try:
        if p.arch is not None:
            if shape is None:
                raise JobInputError("input_shape is needed with arch")
            record = add_builtin(s.database, s.home_path, p.name, p.arch, shape, p.classes, p.seed,
                                 preprocess=prep)
        else:
            assert p.symbol is not None and p.params is not None  # (RegisterParams checks it)
            symbol, params = staged(s.home_path, p.symbol), staged(s.home_path, p.params)
            try:
                record = add_exported(s.database, s.home_path, p.name, symbol, params, shape, prep,
                                      outputs=p.outputs)
            finally:
                shutil.rmtree(symbol.parent, ignore_errors=True)
    except (ModelError, PreprocessError) as exc:
        raise JobInputError(str(exc)) from None
    return Outcome(samples=0, seconds=time.perf_counter() - started, result={"model": dict(record)})
