"""`arch`: the trial of your own architecture's code, and its registration (`mxq arch add`, `POST
/archs`).

The CLI or the API stages the file under `$MXQ_HOME/staging` and queues this job; a device worker
whose device runs MXNet takes it and runs the trial in a child process of its own, as a training
runs its net in the training child (`python -m mxq.tasks.model_store.user_code`: import, build
with the factory, initialize, forward random samples, check the output is (N, classes)), its
output in the job's log. The worker's own process never imports the code. Once the trial
passes, the file is stored by its checksum in the model store (`locations.store_arch`: this
node's folder and the bucket store) and the name's next version is registered (`archs`); a
refusal is the job's one-line error, and nothing is registered.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ValidationError

from mxq.db import registry
from mxq.tasks.job_context import JobContext, JobFailed, JobInputError, Outcome
from mxq.tasks.model_store.locations import sha256_of, store_arch
from mxq.tasks.model_store.register import staged
from mxq.tasks.model_store.user_code import TRIAL_INPUT_ERROR
from mxq.tasks.runner import job_task
from mxq.tasks.training import dist
from mxq.tasks.training.train_task import RELAY_JOIN_SECONDS, child_env, relays, run_file
from mxq.workers.jobs.jobspecs import MAX_ARCH_BYTES, ArchParams

TRIAL_SECONDS = 300  # the most a trial may take (import, build, one forward) before it is killed


class TrialReport(BaseModel):
    """What the trial child wrote: the output shape, or why the code was refused."""

    output_shape: list[int] | None = None
    error: str | None = None


@job_task("arch")
def arch(job: JobContext) -> Outcome:
    s = job.settings
    p = job.params(ArchParams)
    started = time.perf_counter()
    path = staged(s.home_path, p.file)
    try:
        if path.stat().st_size > MAX_ARCH_BYTES:
            raise JobInputError(f"arch {p.name}: {p.file_name} is {path.stat().st_size} bytes; at "
                                f"most {MAX_ARCH_BYTES}")
        sha256 = sha256_of(path)
        shape = _trial(job, p, path, sha256)
        store_arch(s, path, sha256)
        record = registry.add_arch(s.database, {
            "name": p.name, "sha256": sha256, "factory": p.factory, "file_name": p.file_name,
            "classes": p.classes, "input_shape": p.input_shape, "added_by": p.added_by})
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    return Outcome(samples=0, seconds=time.perf_counter() - started,
                   result={"arch": dict(record), "output_shape": shape})


def _trial(job: JobContext, p: ArchParams, path: Path, sha256: str) -> list[int]:
    """Run the trial child to its end: the output shape, or JobInputError with its one line."""
    assert job.fence is not None
    report = run_file(job.settings, job.fence).with_suffix(".arch.json")
    report.parent.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    env, cores = child_env(job.settings, job.devices or [job.device])
    child = subprocess.Popen(
        [sys.executable, "-m", "mxq.tasks.model_store.user_code", str(report), str(path), sha256,
         p.name, p.factory, p.file_name, str(p.classes), ",".join(map(str, p.input_shape))],
        env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: dist.die_with_parent(cores))
    threads = relays(child, job.id)
    try:
        returncode = child.wait(TRIAL_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise JobInputError(f"arch {p.name}: the trial (import, build, one forward) took over "
                            f"{TRIAL_SECONDS} s") from None
    finally:
        for thread in threads:
            thread.join(RELAY_JOIN_SECONDS)
    verdict = _read(report)
    report.unlink(missing_ok=True)
    if returncode == TRIAL_INPUT_ERROR and verdict.error:
        raise JobInputError(verdict.error)
    if returncode != 0 or verdict.output_shape is None:
        raise JobFailed(f"arch {p.name}: the trial process exited with {returncode}"
                        + (f": {verdict.error}" if verdict.error else ""))
    return verdict.output_shape


def _read(report: Path) -> TrialReport:
    try:
        return TrialReport.model_validate_json(report.read_bytes())
    except (OSError, ValidationError):
        return TrialReport()
