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

from mxq.preprocess import PreprocessError
from mxq.tasks.job_context import JobContext, JobInputError, Outcome
from mxq.tasks.model_store.add import add_version
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.runner import job_task
from mxq.workers.jobs.jobspecs import RegisterParams
from mxq.workers.paths import PathError, staging_dir, within


def staged(home: Path, value: str) -> Path:
    """A staged file's path, refused unless it is a file inside `$MXQ_HOME/staging`."""
    try:
        path = within(value, staging_dir(home), "staged file", "MXQ_HOME")
    except PathError as exc:
        raise JobInputError(str(exc)) from None
    if not path.is_file():
        raise JobInputError(f"staged file {value} is not a file")
    return path


@job_task("register")
def register(job: JobContext) -> Outcome:
    s = job.settings
    p = job.params(RegisterParams)
    started = time.perf_counter()
    files = {k: v for k in ("symbol", "params", "onnx") if (v := getattr(p, k)) is not None}
    p = p.model_copy(update={k: str(staged(s.home_path, v)) for k, v in files.items()})
    try:
        record = add_version(s, p)
    except (ModelError, PreprocessError) as exc:
        raise JobInputError(str(exc)) from None
    finally:
        for k in files:
            shutil.rmtree(Path(getattr(p, k)).parent, ignore_errors=True)
    return Outcome(samples=0, seconds=time.perf_counter() - started, result={"model": dict(record)})
