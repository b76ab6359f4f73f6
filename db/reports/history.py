"""Job-history queries and the JSON record that the CLI and scripts rely on."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, func, select

from mxq.db.engine import session_scope
from mxq.db.events import list_events
from mxq.db.fleet import list_workers
from mxq.db.outputs.epochs import list_epochs
from mxq.db.records import FirePolicy, JobRecord, MetricPoint
from mxq.db.schedules import ScheduleNotFound, fire_of
from mxq.db.schema import Job, JobMetric, as_utc, iso
from mxq.errors import NotFound
from mxq.priorities import LEVELS, attempts
from mxq.status import FINISHED, JobKind, JobStatus

_Row = TypeVar("_Row")


@dataclass(frozen=True)
class JobFilter:
    status: str | None = None
    kind: str | None = None
    device: str | None = None
    node: str | None = None
    since: datetime | None = None
    limit: int = 50
    offset: int = 0
    # Keyset paging: only jobs with a smaller id, newest (highest id) first. Offset paging over
    # a list that grows at its head repeats rows (a submit between two pages shifts them).
    before_id: int | None = None
    owner: str | None = None  # who submitted it (`mxq jobs --user`)


def job_record(job: Job) -> JobRecord:
    """The stable JSON shape of one job (`mxq job ID --json`)."""
    return {
        "id": job.id,
        "kind": JobKind(job.kind),
        "status": JobStatus(job.status),
        "params": job.params,
        "requested_device": job.requested_device,
        "queue": job.queue,
        "device": job.device,
        "node": job.node,
        "worker": job.worker,
        "attempts": shown_attempts(job),
        "progress": job.progress,
        "samples": job.samples,
        "seconds": job.seconds,
        "samples_per_sec": job.samples_per_sec,
        "submitted_at": iso(job.submitted_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "result": job.result,
        "error": job.error,
        "parent_id": job.parent_id,
        "chunk_index": job.chunk_index,
        "chunks": job.chunks,
        # Inference names the model it serves `model`, training the one it registers `name`.
        "model": job.params.get("model") or (job.params.get("name") if job.kind == "train" else None),
        "model_version": (job.result or {}).get("model_version", job.params.get("model_version")),
        "output": (job.result or {}).get("output"),
        "devices": job.devices,
        "owner": job.owner,
        "team": job.team,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "preemptions": job.preemptions,
        "device_faults": job.device_faults,
        "borrowed": job.borrowed,
        "pinned": job.pinned,
        "output_removed_at": iso(job.output_removed_at),
        "after": job.after,
    }


def shown_attempts(job: Job) -> int:
    """Its attempts as users see them (`mxq.priorities.attempts`): a job that yielded waits to
    resume while it is queued again after a claim, or was cancelled there (no cancel request
    reached a running attempt)."""
    waiting = job.status == JobStatus.QUEUED or (job.status == JobStatus.CANCELLED
                                                 and job.cancel_requested_at is None)
    return attempts(job.attempts, job.preemptions + job.device_faults, waiting)


def metrics(url: str, job_id: int, points: int | None = None) -> list[MetricPoint]:
    """Throughput over time of a job and, for a parent, of its chunks; with `points`, at most
    that many per job (or chunk) and device: consecutive steps merged in SQL (their samples and
    seconds summed, so each merged point's rate is the true rate over its span; a day-long job
    has ~86,000 points, which a chart refreshed every 2 s should not fetch whole)."""
    with session_scope(url) as session:
        ids = [job_id, *session.scalars(select(Job.id).where(Job.parent_id == job_id))]
        mine = JobMetric.job_id.in_(ids)
        width = 1  # steps per merged point: a job's steps count up from 0 (over its devices)
        if points is not None:
            last = session.scalar(select(func.max(JobMetric.step)).where(mine))
            width = max(1, -(-((last or 0) + 1) // points))
        if width == 1:
            rows = session.execute(select(JobMetric.job_id, JobMetric.step, JobMetric.at,
                                          JobMetric.device, JobMetric.samples, JobMetric.seconds)
                                   .where(mine).order_by(JobMetric.at, JobMetric.job_id, JobMetric.step))
        else:
            bucket = JobMetric.step // width
            rows = session.execute(
                select(JobMetric.job_id, func.max(JobMetric.step), func.max(JobMetric.at),
                       JobMetric.device, func.sum(JobMetric.samples), func.sum(JobMetric.seconds))
                .where(mine).group_by(JobMetric.job_id, JobMetric.device, bucket)
                .order_by(func.max(JobMetric.at), JobMetric.job_id, func.max(JobMetric.step)))
        return [{"job_id": j, "step": step, "at": iso(at), "device": device, "samples": int(n),
                 "seconds": float(t), "samples_per_sec": float(n) / float(t) if t else 0.0}
                for j, step, at, device, n, t in rows]


class JobNotFound(NotFound):
    """No such job."""


def require_job(url: str, job_id: int, with_metrics: bool = False,
                points: int | None = None) -> JobRecord:
    """The job's record (`get_job`); JobNotFound when there is none."""
    record = get_job(url, job_id, with_metrics, points)
    if record is None:
        raise JobNotFound(f"no job {job_id}")
    return record


def get_job(url: str, job_id: int, with_metrics: bool = False,
            points: int | None = None) -> JobRecord | None:
    """The job's record; `with_metrics` adds its throughput points (at most about `points` per
    device, merged: `metrics`), events and, for training, epochs and schedule."""
    with session_scope(url) as session:
        job = session.get(Job, job_id)
        record = job_record(job) if job else None
    if record and with_metrics:
        record["metrics"] = metrics(url, job_id, points)
        record["events"] = list_events(url, job_id)
        if record["kind"] == "train":
            record["epochs"] = list_epochs(url, job_id)
            record["schedule"] = _schedule_of(url, record["params"].get("fire_id"))
    return record


def _schedule_of(url: str, fire_id: int | None) -> FirePolicy | None:
    """The fire behind a scheduled training; None for another, or for a fire deleted with its
    schedule before fires were kept (migration 0009): the job still describes itself."""
    if fire_id is None:
        return None
    try:
        return fire_of(url, fire_id)
    except ScheduleNotFound:
        return None


def _filtered(q: Select[_Row], f: JobFilter) -> Select[_Row]:
    for column, value in ((Job.status, f.status), (Job.kind, f.kind),
                          (Job.device, f.device), (Job.node, f.node), (Job.owner, f.owner)):
        if value is not None:
            q = q.where(column == value)
    if f.before_id is not None:
        q = q.where(Job.id < f.before_id)
    return q if f.since is None else q.where(Job.submitted_at >= f.since)


def list_jobs(url: str, f: JobFilter) -> list[JobRecord]:
    """Newest first, filtered, one page; with `before_id`, by id (a stable key to page on)."""
    order = (Job.id.desc(),) if f.before_id is not None else (Job.submitted_at.desc(), Job.id.desc())
    q = _filtered(select(Job), f).order_by(*order)
    with session_scope(url) as session:
        return [job_record(j) for j in session.scalars(q.limit(f.limit).offset(f.offset))]


def jobs_by_keys(url: str, keys: list[str], owner: str) -> list[JobRecord]:
    """The jobs `owner`'s submits made with these idempotency keys, in id order (keys are per
    owner)."""
    with session_scope(url) as session:
        return [job_record(job) for job in session.scalars(
            select(Job).where(Job.idempotency_key.in_(keys), Job.owner == owner).order_by(Job.id))]


def count_jobs(url: str, f: JobFilter, at_most: int | None = None) -> int:
    """How many jobs match; with `at_most`, counted no further than at_most + 1 (an exact count
    of a filter that matches millions of jobs reads every one of them)."""
    matches = _filtered(select(Job.id), f)
    if at_most is not None:
        matches = matches.limit(at_most + 1)
    with session_scope(url) as session:
        return session.scalar(select(func.count()).select_from(matches.subquery())) or 0


def counts_by_status_and_kind(url: str) -> dict[tuple[str, str], int]:
    """(status, kind) -> number of jobs, of the whole history."""
    q = select(Job.status, Job.kind, func.count()).group_by(Job.status, Job.kind)
    with session_scope(url) as session:
        return {(str(status), str(kind)): int(n) for status, kind, n in session.execute(q)}


def queued_by_priority(url: str) -> dict[str, int]:
    """priority -> number of queued jobs (every priority, 0 when none waits): what runs next."""
    q = (select(Job.priority, func.count()).where(Job.status == JobStatus.QUEUED)
         .group_by(Job.priority))
    with session_scope(url) as session:
        found = {str(level): int(n) for level, n in session.execute(q)}
    return {level: found.get(level, 0) for level in LEVELS}


def active_by_owner(url: str) -> dict[tuple[str, str], int]:
    """(owner, status) -> number of queued or running jobs: what each user holds and waits for
    now (`-` for jobs from before owners)."""
    q = (select(Job.owner, Job.status, func.count())
         .where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
         .group_by(Job.owner, Job.status))
    with session_scope(url) as session:
        return {(owner or "-", status): n for owner, status, n in session.execute(q)}


def counts_by_queue(url: str) -> dict[tuple[str, str], int]:
    """(queue, status) -> number of queued or running jobs, for the device table."""
    q = (select(Job.queue, Job.status, func.count())
         .where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
         .group_by(Job.queue, Job.status))
    with session_scope(url) as session:
        return {(queue, status): n for queue, status, n in session.execute(q)}


def running_by_worker(url: str) -> dict[str, int]:
    q = (select(Job.worker, func.count()).where(Job.status == JobStatus.RUNNING)
         .group_by(Job.worker))
    with session_scope(url) as session:
        return {w: n for w, n in session.execute(q) if w}


def device_records(url: str, ttl: float) -> list[dict[str, Any]]:
    """One record per known device worker: where its work queues, is it live, how busy."""
    counts = counts_by_queue(url)
    running = running_by_worker(url)
    records = []
    for w in list_workers(url, ttl):
        records.append({
            "device": w["device"], "node": w["node"], "queue": w["queue"], "worker": w["name"],
            "alive": w["alive"], "queued": counts.get((w["queue"], JobStatus.QUEUED), 0),
            "running": running.get(w["name"], 0), "current_job": w["current_job"],
            "last_heartbeat": w["last_seen"], "heartbeat_age": w["heartbeat_age"],
            "pid": w["pid"], "started_at": w["started_at"], "engines": w["engines"],
            **{k: v for k, v in (w["info"] or {}).items() if k != "device"},
        })
    return records



def oldest_queued(url: str) -> dict[str, tuple[int, datetime]]:
    """Queue -> (queued jobs, when the oldest of them was submitted): how long work has waited,
    also in the queue of a device that has no worker (`--allow-offline`)."""
    q = (select(Job.queue, func.count(), func.min(Job.submitted_at))
         .where(Job.status == JobStatus.QUEUED).group_by(Job.queue))
    with session_scope(url) as session:
        return {str(queue): (int(n), as_utc(oldest)) for queue, n, oldest in session.execute(q)}


def pool_depths(url: str) -> dict[str, int]:
    """Jobs waiting in each shared pool queue."""
    return {q: n for (q, status), n in counts_by_queue(url).items()
            if status == JobStatus.QUEUED and q.startswith("pool.")}


def _refused_at_submit() -> ColumnElement[bool]:
    """Jobs recorded failed at submit (`JobRejected`: an unknown model, bad parameters): they
    never reached a worker, so they have no start and no attempt."""
    return (Job.status == JobStatus.FAILED) & Job.started_at.is_(None) & (Job.attempts == 0)


def durations_by_kind(url: str) -> dict[str, tuple[int, float]]:
    """(count, total run time in seconds) of every finished job per kind, succeeded, failed or
    cancelled alike: run time is its last attempt's start to its finish, so a training counts
    its whole run (data loading, checkpoints, registration), not only its compute. Chunks and
    node parts are inside their parent's run and not counted again; a job refused at submit
    never ran."""
    finished = (Job.status.in_(FINISHED) & Job.started_at.is_not(None)
                & Job.finished_at.is_not(None) & Job.parent_id.is_(None))
    with session_scope(url) as session:
        pg = session.get_bind().dialect.name == "postgresql"
        run = (func.extract("epoch", Job.finished_at - Job.started_at) if pg
               else (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0)
        q = select(Job.kind, func.count(), func.sum(run)).where(finished).group_by(Job.kind)
        return {str(kind): (int(n), max(float(total or 0.0), 0.0))
                for kind, n, total in session.execute(q)}


def stats(url: str, by: str) -> list[dict[str, Any]]:
    """Per device, model or day: jobs, outcomes, success rate, samples and samples/s."""
    with session_scope(url) as session:
        pg = session.get_bind().dialect.name == "postgresql"
        key = {"device": Job.device,  # inference names its model `model`, training `name`
               "model": func.coalesce(Job.params["model"].as_string(), Job.params["name"].as_string()),
               "day": func.to_char(Job.submitted_at, "YYYY-MM-DD") if pg
               else func.date(Job.submitted_at)}[by]
        q = (select(key, Job.status, func.count(), func.sum(Job.samples), func.sum(Job.seconds))
             .where(key.is_not(None)).group_by(key, Job.status))
        if by == "model":  # a request refused at submit names a model it never ran (or none)
            q = q.where(~_refused_at_submit())
        tallies: dict[str, _Tally] = {}
        for k, status, n, samples, seconds in session.execute(q):
            tallies.setdefault(k, _Tally()).add(status, n, samples or 0, seconds or 0.0)
    return [tallies[k].record(by, k) for k in sorted(tallies, key=str)]


@dataclass
class _Tally:
    """One row of `stats` as its jobs are counted: successes alone count samples and seconds."""

    jobs: int = 0
    ended: dict[str, int] = field(default_factory=lambda: {str(end): 0 for end in FINISHED})
    samples: int = 0
    seconds: float = 0.0

    def add(self, status: str, n: int, samples: int, seconds: float) -> None:
        self.jobs += n
        if status in FINISHED:
            self.ended[status] += n
        if status == JobStatus.SUCCEEDED:
            self.samples += samples
            self.seconds += seconds

    def record(self, by: str, key: str) -> dict[str, Any]:  # Any: its readers sum the counts
        done = sum(self.ended.values())
        return {by: key, "jobs": self.jobs, **self.ended, "samples": self.samples,
                "seconds": self.seconds,
                "success_rate": self.ended[JobStatus.SUCCEEDED] / done if done else None,
                "samples_per_sec": self.samples / self.seconds if self.seconds else None}


def device_rates(url: str, since: datetime) -> dict[tuple[str, str], float]:
    """Samples/s per (node, device) from the throughput points recorded since `since`: a
    device label such as cpu:0 exists on every node."""
    q = (select(Job.node, JobMetric.device, func.sum(JobMetric.samples), func.sum(JobMetric.seconds))
         .join(Job, Job.id == JobMetric.job_id)
         .where(JobMetric.at >= since, JobMetric.device.is_not(None), Job.node.is_not(None))
         .group_by(Job.node, JobMetric.device))
    with session_scope(url) as session:
        return {(str(node), str(d)): float(n) / float(t) for node, d, n, t in session.execute(q) if t}
