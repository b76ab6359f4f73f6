"""The retention policy: what mxq removes by itself, and what only when a user sets how much to
keep. Without it nothing was ever deleted: outputs, checkpoints, run files, staging files and
old versions grew without end.

Always (nothing reads them again):
- a training's checkpoints (`checkpoints/STACK/job-ID/`) once it registered its version;
- the run files of finished jobs (`runs/job-ID.*`);
- staging files left in `tmp/` for more than STAGING_DAYS.

When a user sets it:
- MXQ_KEEP_OUTPUT_DAYS=N: the outputs of inference jobs finished more than N days ago (their
  files in this home and their SQL rows), never a pinned job's (`mxq pin`); the job's record
  stays and says when its output went;
- MXQ_KEEP_VERSIONS=N: each model's unpromoted versions beyond its newest N (their files in
  this home, and in the bucket store), never a promoted version or one a queued or running job
  names; the row stays, marked removed.

Objects a job wrote to a user's bucket (`--output-to`) are left to the bucket's own lifecycle
rules. The schedule process applies the policy every hour (workers/broker/app.RETENTION_SECONDS);
`mxq gc [--dry-run]` applies it now, or says what it would remove. Each node's `mxq gc` applies
it to its own home.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from mxq.db.engine import answers_within
from mxq.db.outputs import predictions
from mxq.db.outputs import retention as rows
from mxq.db.outputs.results import output_file
from mxq.db.schema import utcnow
from mxq.db.stack import stack_id
from mxq.workers.settings import Settings
from mxq.workers.storage.versions import remove_version, store_dir

STAGING_DAYS = 1  # a staging file lives for the upload of one part: a day-old one is left over
DATABASE_SECONDS = 600  # a large job's rows take a while to delete
_JOB_FILE = re.compile(r"job-(\d{1,18})(?:$|\.)")


@dataclass(frozen=True)
class Removal:
    """One thing the policy removes (or, in a dry run, would remove), and why."""

    what: str  # checkpoints, run file, staging file, output, prediction rows, version
    where: str  # a path, `job N` or NAME:VERSION
    bytes: int
    why: str

    def as_dict(self) -> dict[str, str | int]:
        return asdict(self)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _job_id(path: Path) -> int | None:
    found = _JOB_FILE.match(path.name)
    return int(found.group(1)) if found else None


def _by_job(folder: Path) -> dict[int, list[Path]]:
    """The entries of `folder` named after a job (`job-ID…`), by job id."""
    if not folder.is_dir():
        return {}
    found: dict[int, list[Path]] = {}
    for path in folder.iterdir():
        if (job_id := _job_id(path)) is not None:
            found.setdefault(job_id, []).append(path)
    return found


def _checkpoints(settings: Settings) -> list[Removal]:
    folder = settings.home_path / "checkpoints" / stack_id(settings.database)
    held = _by_job(folder)
    done = rows.finished(settings.database, set(held))
    return [Removal("checkpoints", str(p), _size(p), f"job {i} registered its version")
            for i, paths in held.items() if done.get(i, {}).get("registered") for p in paths]


def _run_files(settings: Settings) -> list[Removal]:
    held = _by_job(settings.home_path / "runs")
    done = rows.finished(settings.database, set(held))
    return [Removal("run file", str(p), _size(p), f"job {i} is {done[i]['status']}")
            for i, paths in held.items() if i in done for p in paths]


def _staging(settings: Settings) -> list[Removal]:
    folder = settings.home_path / "tmp"
    if not folder.is_dir():
        return []
    before = time.time() - STAGING_DAYS * 86400
    return [Removal("staging file", str(p), _size(p), f"left over for more than {STAGING_DAYS} day")
            for p in folder.iterdir() if p.stat().st_mtime < before]


def _outputs(settings: Settings, days: int) -> list[tuple[int, list[Removal]]]:
    """Per expired job, its local output files and its rows."""
    why = f"finished more than {days} days ago (MXQ_KEEP_OUTPUT_DAYS)"
    stack = stack_id(settings.database)
    found = []
    for job in rows.expired_outputs(settings.database, utcnow() - timedelta(days=days)):
        files = [output_file(settings.home_path, stack, job.job_id, suffix)
                 for suffix in (".npy", ".parquet", ".parquet.parts", ".lock")]  # .lock: a writer's
        files += sorted(files[0].parent.glob(f"job-{job.job_id}.*.npy"))  # several outputs' files
        files += sorted(files[0].parent.glob(f"job-{job.job_id}.*.lock"))  # and their locks
        if job.output and not job.output.startswith("s3://") and job.output != "db":
            files.append(Path(job.output))  # where an older mxq kept it
        outputs = (settings.home_path / "outputs").resolve()
        removals = [Removal("output", str(f), _size(f), why) for f in dict.fromkeys(files)
                    if f.exists() and f.resolve().is_relative_to(outputs)]  # never anything else
        count = predictions.count(settings.database, job.job_id)
        if count:
            removals.append(Removal("prediction rows", f"job {job.job_id}", 0, f"{count} rows, {why}"))
        found.append((job.job_id, removals))
    return found


def collect(settings: Settings, dry_run: bool = False) -> list[Removal]:
    """Apply the policy in this home (or, with `dry_run`, only say what it would remove)."""
    with answers_within(DATABASE_SECONDS):
        removals = _checkpoints(settings) + _run_files(settings) + _staging(settings)
        if not dry_run:
            for r in removals:
                _remove(Path(r.where))
        if settings.keep_output_days is not None:
            removals += _apply_outputs(settings, settings.keep_output_days, dry_run)
        if settings.keep_versions is not None:
            removals += _apply_versions(settings, settings.keep_versions, dry_run)
    return removals


def _apply_outputs(settings: Settings, days: int, dry_run: bool) -> list[Removal]:
    """Each expired job's rows go and it is marked first, then its files: a pin that lands
    meanwhile keeps them. Pass after pass until none is left (a pass reads at most 1,000)."""
    done: list[Removal] = []
    while expired := _outputs(settings, days):
        for job_id, removals in expired:
            if not dry_run:
                if rows.mark_output_removed(settings.database, job_id) is None:
                    continue  # pinned meanwhile: its files stay
                for r in removals:
                    if r.what == "output":
                        _remove(Path(r.where))
            done += removals
        if dry_run:
            break
    return done


def _apply_versions(settings: Settings, keep: int, dry_run: bool) -> list[Removal]:
    done: list[Removal] = []
    why = f"unpromoted, older than the newest {keep} (MXQ_KEEP_VERSIONS)"
    for old in rows.versions_beyond(settings.database, keep):
        removal = Removal("version", f"{old.name}:{old.version}", _size(
            store_dir(settings.home_path, settings.database, old.name, old.version)), why)
        if dry_run:
            done.append(removal)
        elif rows.mark_version_removed(settings.database, old.name, old.version):
            remove_version(settings, old.name, old.version, old.files)
            done.append(removal)
    return done

