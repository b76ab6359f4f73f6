"""An inference schedule's fire: score each new file of its input once with the model version
it follows (the promoted one, or the one it pins).

A file is new to a version when the version never scored its bytes: a local file is known by its
size and SHA-256 (so a file rewritten in place is new, a file renamed or copied is not), an object
by its size and ETag. The hash is read only for a file whose path, size and mtime the version has
not seen (`claims.seen`). All of it is the schedule's own: another schedule over the same bytes
scores them for itself. Each new file is claimed in SQL before its job is submitted, and the job
carries an idempotency key made from the claim: a fire that dies anywhere (the schedule process
killed mid-fire) is finished by the reconciler or the next fire with every file's job made once.
A file still being written (its size or mtime moved while it was hashed) waits for the next fire.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Iterator
from datetime import datetime

from mxq.db import schedules
from mxq.db.records import ScheduleRecord, StoredSchedule, UnscoredInput
from mxq.db.registry import resolve
from mxq.db.schedules import claims
from mxq.db.schedules.claims import Scorer, Sighting
from mxq.db.schema import utcnow
from mxq.db.sharing.teams import check_team
from mxq.errors import Conflict, JobRejected
from mxq.json_types import JsonMapping
from mxq.names import check_name
from mxq.priorities import Priority, parse
from mxq.status import JobKind
from mxq.users import local_owner
from mxq.workers.broker.queues import parse_device
from mxq.workers.broker.routing import check_known
from mxq.workers.jobs.idempotency import IdempotencyConflict
from mxq.workers.jobs.jobspecs import ParamsError, validate
from mxq.workers.jobs.kinds.infer import InferParams, check_against_model
from mxq.workers.jobs.submit import submit_request
from mxq.workers.paths import PathError
from mxq.workers.schedules.cron import check, next_after
from mxq.workers.schedules.sources import Found, check_source, every_file
from mxq.workers.settings import Settings
from mxq.workers.storage.client import StorageError

log = logging.getLogger(__name__)
READ_BYTES = 1 << 20  # a file is hashed a megabyte at a time


def sighting_of(found: Found) -> Sighting | None:
    """The bytes' identity (None for a local file that changed while it was read, or went, or
    is no regular file now).

    Whatever was moved over the listed name meanwhile, nothing here can block: the name is
    opened without waiting (a FIFO would wait for a writer), the opened descriptor must be a
    regular file (not a FIFO, a socket or a device), and at most the listed size and one byte
    more are read (a file still growing is read again by the next fire)."""
    if found.etag is not None:
        return Sighting(found.location, f"{found.size} bytes, ETag {found.etag}", found.size)
    digest = hashlib.sha256()
    try:
        fd = os.open(found.location, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            left = found.size + 1
            while left > 0 and (block := f.read(min(READ_BYTES, left))):
                digest.update(block)
                left -= len(block)
            st = os.fstat(fd)
        except OSError:
            return None
    if left <= 0 or (st.st_size, st.st_mtime_ns) != (found.size, found.mtime_ns):
        return None
    return Sighting(found.location, f"{found.size} bytes, sha256 {digest.hexdigest()}", found.size,
                    found.mtime_ns)


def priority_of(sched: StoredSchedule, rescore: bool) -> Priority:
    """A fire's jobs' priority: the schedule's, or its `rescore` level for a fire a promotion made
    (low by default, so re-scoring never holds up urgent work)."""
    if rescore and sched["rescore"]:
        return Priority.of(sched["rescore"], None)
    return Priority.of(sched["priority"], sched["preemptible"])


def fire(settings: Settings, sched: StoredSchedule, fire_id: int) -> int:
    """Submit a job for each file of the schedule's input its version has not scored; record
    how many on the fire and return that count. Whether the fire re-scores after a promotion
    (at the schedule's `--rescore` level) is decided by `schedules.follow`, whoever fired it."""
    spec = sched["spec"]
    version = resolve(settings.database, spec["model"], spec.get("model_version"))["version"]
    scoring = schedules.follow(settings.database, sched["id"], fire_id, version)
    if scoring is schedules.Scoring.TAKEN:  # another fire re-scores this version's files
        schedules.settle_fire(settings.database, fire_id, scored=0, dataset_file=sched["dataset"])
        return 0
    priority = priority_of(sched, scoring is schedules.Scoring.RESCORE)
    by = Scorer(sched["id"], spec["model"], version)
    for found, sighting in _unseen(settings, by, sched["dataset"]):
        if sighting is None:
            continue  # still being written, or gone: the next fire looks again
        claim = claims.claim(settings.database, by, sighting, fire_id)
        if not claim.settled:
            _score(settings, sched, version, priority, claim.id, found.location)
    made = len(claims.jobs_of_fire(settings.database, fire_id))
    schedules.settle_fire(settings.database, fire_id, scored=made, dataset_file=sched["dataset"])
    return made


def _unseen(settings: Settings, by: Scorer, source: str) -> Iterator[tuple[Found, Sighting | None]]:
    """Each file of `source` that the schedule's version has not seen at its path with its size
    and mtime, with its bytes' identity (read now: None for a file that changed while read, or
    went)."""
    for found in every_file(settings, source):
        if found.mtime_ns is None or not claims.seen(settings.database, by, found.location,
                                                     found.size, found.mtime_ns):
            yield found, sighting_of(found)


def _score(settings: Settings, sched: StoredSchedule, version: int, priority: Priority,
           claim_id: int, location: str) -> None:
    """Submit the claimed file's job and settle the claim with it (or with why it was refused:
    a bad file fails once, as a job that says why, and is not tried again by this version)."""
    params = {k: v for k, v in sched["spec"].items() if k != "device"}
    params.update(input=location, model_version=version)
    try:
        done = submit_request(settings, JobKind.INFER, params, sched["spec"].get("device") or "auto",
                              allow_offline=True, idempotency_key=claims.key_of(claim_id),
                              owner=sched["owner"], priority=priority, team=sched["team"])
    except JobRejected as exc:
        claims.settle(settings.database, claim_id, exc.job_id, str(exc))
        return
    except IdempotencyConflict as exc:  # the file changed between a dead fire's submit and now
        claims.settle(settings.database, claim_id, None, str(exc))
        return
    except (PathError, StorageError) as exc:
        log.info("schedule %s: %s went away before its job was made (%s)", sched["name"], location, exc)
        claims.release(settings.database, claim_id)
        return
    claims.settle(settings.database, claim_id, done.job_id)


def model_and_version(text: str) -> tuple[str, int | None]:
    """`--infer MODEL[:VERSION]` parsed: a pinned version, or None to follow the promoted one."""
    name, colon, version = text.partition(":")
    if colon and not (version.isdecimal() and 0 < int(version) < 2**31):
        raise ParamsError(f"--infer {text[:80]!r}: the version after ':' must be a positive "
                          "number, as in NAME:3 (or give NAME alone to follow its promoted version)")
    return name, int(version) if colon else None


def add_infer_schedule(settings: Settings, name: str, cron: str, tz: str, source: str,
                       request: JsonMapping, device: str = "auto", rescore: str | None = "low",
                       now: datetime | None = None, owner: str | None = None,
                       priority: Priority = Priority(), team: str | None = None) -> ScheduleRecord:
    """Check everything a fire will need (the request against the version it scores with, the
    input source inside the data root or the allowed buckets), then store the schedule.

    `request` is an inference request less its input (`model` may pin `NAME:VERSION`); with
    `rescore` (a priority level), a promotion of another version fires the schedule at once, its
    jobs at that level; a pinned version has nothing to re-score."""
    owner = owner or local_owner()
    check_name(name, "schedule name")
    team = check_team(settings.database, team, owner)
    check(cron, tz)
    model, pinned = model_and_version(str(request.get("model", "")))
    given = request.get("model_version")  # the API's field, as `mxq infer` takes it
    pinned = pinned or (given if isinstance(given, int) else None)
    if rescore is not None:
        rescore = parse(rescore).value
        if pinned is not None:
            raise ParamsError(f"--infer {model}:{pinned} pins a version, which no promotion "
                              "changes: give --rescore off, or follow the promoted version (NAME)")
    spec = {**{k: v for k, v in request.items() if v is not None}, "model": model,
            "model_version": given if pinned is None else pinned}
    typed = validate(JobKind.INFER, {**spec, "input": source})
    assert isinstance(typed, InferParams)
    check_against_model(settings, typed, resolve(settings.database, model, pinned))
    check_source(settings, source)
    check_known(settings, parse_device(device))  # as `mxq infer --device` (it fires unattended)
    return schedules.add(settings.database, {
        "name": name, "cron": cron, "tz": tz, "spec": {**spec, "device": device}, "dataset": source,
        "promote": "never", "metric": "-", "min_gain": 0.0, "enabled": True, "kind": "infer",
        "rescore": rescore, "next_fire_at": next_after(cron, tz, now or utcnow()), "owner": owner,
        "team": team, "priority": priority.level, "preemptible": priority.preemptible})


def unscored(settings: Settings, name: str, version: int | None = None) -> tuple[int, list[UnscoredInput]]:
    """The files of inference schedule `name`'s input whose bytes `version` has not scored
    (default: the version its fires score with now, the promoted one unless it pins one), as
    its next fire would judge them; with that version."""
    sched = schedules.get(settings.database, name)
    if sched["kind"] != "infer":
        raise Conflict(f"schedule {name!r} retrains; unscored inputs are an inference "
                       "schedule's (mxq schedule add NAME --infer MODEL --input GLOB)")
    model = sched["spec"]["model"]
    version = version or resolve(settings.database, model, sched["spec"].get("model_version"))["version"]
    by = Scorer(sched["id"], model, version)
    return version, [{"location": found.location, "size": found.size}
                     for found, sighting in _unseen(settings, by, sched["dataset"])
                     if sighting is None or not claims.has(settings.database, by, sighting.identity)]
