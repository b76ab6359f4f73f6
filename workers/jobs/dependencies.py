"""Job dependencies (`--after JOB[,JOB…]`, Slurm's afterok): a job that waits until other jobs
succeed, and fails, naming the one that did not, when one fails or is cancelled.

It reuses admission's hold rather than a second path: a submit with `after` writes its jobs
`held` (nothing publishes them) and `awaiting` (admission does not see them: they take no turn
and count as no owner's waiting work). The dependency pass (`settle`) runs where the admitter
runs, after a submit, at every job's end (the job frame's hook `tasks/middleware/admission.py`), after
a cancel and at every reconciler pass, whether or not any user has a share or a quota: it reads
the waiting jobs and the outcomes of the jobs they wait for, lets `mxq.status.after_verdict`
decide, and with one guarded UPDATE each either fails a job or ends its wait. A job whose wait
ended is released and published at once while admission is off, and left held for the
admitter's fair order while it is on.

The ids are checked where they enter (`checked`): positive integers, at most MOST_AFTER, each a
job that exists and that the submitter may read (`mxq.users.may_read`); a job can only wait for
jobs submitted before it, so it never waits for itself and no wait is ever a cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from mxq.db.sharing import dependencies
from mxq.db.sharing.teams import rights_of
from mxq.names import MAX_ID, shown
from mxq.status import MOST_AFTER, MOST_AFTER_LISTED, after_verdict
from mxq.users import may_read
from mxq.workers.broker.publish import republish
from mxq.workers.jobs import admit
from mxq.workers.jobs.jobspecs import ParamsError
from mxq.workers.settings import Settings

log = logging.getLogger(__name__)
LOOK = 5000  # waiting jobs decided per pass, oldest first (the next pass decides the rest)


def _ids(after: Sequence[object]) -> list[int]:
    """`after` as job ids (each once, in the order given: a job named twice counts once), or
    ParamsError naming the value."""
    if len(after) > MOST_AFTER_LISTED:
        raise ParamsError(f"--after lists {len(after)} entries: allowed: at most {MOST_AFTER} "
                          f"jobs in at most {MOST_AFTER_LISTED} entries")
    ids: list[int] = []
    for value in after:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ID:
            raise ParamsError(f"--after {shown(value)}: allowed: job ids, whole numbers from 1 to "
                              f"{MAX_ID} (e.g. --after 12,15)")
        if value not in ids:
            ids.append(value)
    if len(ids) > MOST_AFTER:
        raise ParamsError(f"--after lists {len(ids)} jobs: allowed: at most {MOST_AFTER}")
    return ids


def checked(settings: Settings, after: Sequence[object] | None, owner: str) -> list[int] | None:
    """The jobs a submit by `owner` waits for, checked (None: it waits for none), or one-line
    ParamsError naming the id and what is allowed: an id that is no job yet (this job's own
    included: its id is not given yet), or one whose owner `owner` may not read."""
    if not after:
        return None
    ids = _ids(after)
    known = dependencies.owners(settings.database, ids)
    if missing := [i for i in ids if i not in known]:
        raise ParamsError(f"--after {missing[0]}: no such job; allowed: jobs submitted before this "
                          "one (a job cannot wait for itself or for a later job)")
    rights = rights_of(settings.database, owner)
    for job_id in ids:
        job_owner, team = known[job_id]
        if rights.role is None or not may_read(rights.role, owner, rights.teams, job_owner, team):
            raise ParamsError(f"--after {job_id}: user {owner!r} may not read job {job_id} (of "
                              f"{job_owner or 'nobody'}); allowed: jobs its owner, its team's "
                              "members or an admin may read")
    return ids


@dataclass
class Settled:
    """What one pass did: the jobs it released to the broker, the jobs whose wait ended and that
    the admitter now holds, the jobs it failed."""

    released: list[int] = field(default_factory=list)
    admitting: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


def settle(settings: Settings) -> Settled:
    """Decide every waiting job whose jobs have decided: fail it, or end its wait (released and
    published now while admission is off). Oldest first, each decision seen by the jobs after
    it, so a failure runs down a chain in one pass."""
    url = settings.database
    done = Settled()
    waiting = dependencies.awaiting(url, LOOK)
    if not waiting:
        return done
    outcomes = dependencies.outcomes(url, {i for _, after in waiting for i in after})
    release = not admit.holding(settings)
    for job_id, after in waiting:
        verdict = after_verdict(after, outcomes)
        if verdict.error is not None:
            if dependencies.fail(url, job_id, verdict.error):
                done.failed.append(job_id)
                outcomes[job_id] = ("failed", verdict.error)
        elif verdict.ready:
            _end_wait(settings, job_id, release, done)
    if done.failed or done.released or done.admitting:
        log.info("dependencies: released %s, to the admitter %s, failed %s", done.released,
                 done.admitting, done.failed)
    return done


def _end_wait(settings: Settings, job_id: int, release: bool, done: Settled) -> None:
    """End the wait of a job whose jobs all succeeded: published now while admission is off,
    else handed to the admitter (nothing when another pass ended it first)."""
    route = dependencies.met(settings.database, job_id, release)
    if route is None:
        return
    if release:
        republish(settings, job_id, route)
        done.released.append(job_id)
    else:
        done.admitting.append(job_id)


def settle_quietly(settings: Settings) -> None:
    """`settle` at a job's end or after a cancel, where a failure must not fail the caller:
    logged, and the reconciler's next pass settles."""
    try:
        settle(settings)
    except Exception:  # the caller's work is done; the reconciler settles every pass
        log.warning("dependency pass failed; the reconciler will settle", exc_info=True)


def reasons(settings: Settings) -> dict[int, str]:
    """waiting job -> why it waits (`mxq queue`): the first job it waits for not finished."""
    waiting = dependencies.awaiting(settings.database, LOOK)
    outcomes = dependencies.outcomes(settings.database, {i for _, after in waiting for i in after})
    said: dict[int, str] = {}
    for job_id, after in waiting:
        verdict = after_verdict(after, outcomes)
        if verdict.waits_for is not None:
            said[job_id] = f"waits for job {verdict.waits_for} (--after)"
        elif verdict.error is not None:
            said[job_id] = f"fails at the next pass: {verdict.error}"
        else:
            said[job_id] = "its --after jobs succeeded: released at the next pass"
    return said


def note(job_id: int, after: list[int]) -> str:
    """A submit's answer for a job that waits."""
    jobs = ", ".join(map(str, after))
    return (f"job {job_id} is queued and waits for job{'s' if len(after) > 1 else ''} {jobs} "
            "(--after): it runs once they succeed, and fails if one does not")
