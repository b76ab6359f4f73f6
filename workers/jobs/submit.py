"""Submit jobs: validate, write their rows, publish JSON messages that carry only job ids.

One path (`submit_jobs`) for one job and for many: a single submit is a batch of one, and both
answer alike. It takes each kind's typed request (the model the API validates; `submit_json`
reads a CLI's or a script's options as that model first) and `SubmitOptions`. Each kind's own
checks live with its model (infer.py, train.py); idempotency, the broker's side and admission
in modules of their own. The rows come first, so a worker always finds its job. A broker that refuses
connections is found before anything is written; one that does not answer within
MXQ_BROKER_TIMEOUT_SECONDS (paused, frozen) leaves the rows `queued` without their messages,
the answer says so (`published` false), and the reconciler publishes them once the broker
answers. Wrong parameters are recorded as a failed job. An idempotency key makes a retry of the
same submit return the first jobs instead of new ones.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from mxq.db.jobs import IdempotencyKeyTaken, create_job, create_jobs
from mxq.db.registry import check_registrant
from mxq.db.sharing import admission
from mxq.db.sharing.teams import check_team
from mxq.engines import needed
from mxq.errors import JobRejected, UserError
from mxq.json_types import JsonMapping, JsonObject, JsonReadable, JsonValue
from mxq.objects import ObjectURLError
from mxq.priorities import Priority
from mxq.shares import Share, beyond_quota, devices_needed
from mxq.status import JobKind
from mxq.users import local_owner
from mxq.workers.broker.publish import SubmitError, Turn
from mxq.workers.broker.queues import parse_device
from mxq.workers.broker.routing import Need, Route, route
from mxq.workers.jobs import admit, dependencies, preempt
from mxq.workers.jobs.idempotency import (
    IDEMPOTENCY_KEY_PATTERN,
    MAX_KEY_CHARS,
    IdempotencyConflict,
    Request,
    check_key,
    keys_of,
    replay,
)
from mxq.workers.jobs.jobspecs import SPECS, JobParams, JobRequest, known_kind, request_of
from mxq.workers.jobs.kinds.infer import InferParams, Models, need_of, resolve_infer
from mxq.workers.jobs.kinds.params import ParamsError, Rejected, check_model_no_nul, fields_of, stored
from mxq.workers.jobs.kinds.train import TrainParams, resolve_train
from mxq.workers.jobs.publishing import broker_late, check_broker, check_database, publish_all
from mxq.workers.jobs.submitted import DEFAULT_OPTIONS, SubmitOptions, Submitted
from mxq.workers.paths import PathError
from mxq.workers.settings import Settings
from mxq.workers.storage.client import StorageError

__all__ = ["IDEMPOTENCY_KEY_PATTERN", "MAX_KEY_CHARS", "STORED_CHARS", "BeyondQuota",
           "IdempotencyConflict", "SubmitOptions", "Submitted", "check_broker", "check_database",
           "submit", "submit_jobs", "submit_json", "submit_many", "submit_request"]

log = logging.getLogger(__name__)

JOBS_IN_WORDS = {JobKind.TRAIN: "a training", JobKind.PROBE: "a probe",
                 JobKind.REGISTER: "a model's registration", JobKind.ARCH: "an architecture's trial"}
# A job as the pipeline takes it: its kind's typed request, or a request that could not be read
# as one (`params.Rejected`: a CLI command's or a script's options that do not fit), which the
# submit records as a failed job. The pipeline never validates a dict itself.
Asked: TypeAlias = JobRequest | Rejected
# A job as the one-job and many-job helpers take it: also options as JSON (a script's, a bench's,
# a stored schedule's), read as the kind's request first (`jobspecs.request_of`).
Given: TypeAlias = JobRequest | Rejected | JsonMapping

# The most of one rejected string a failed job's row keeps: a path of a megabyte is refused,
# not stored whole in the history.
STORED_CHARS = 1024


def _storable_text(value: str) -> str:
    """A rejected string as the row keeps it: its beginning and length past STORED_CHARS, its
    NUL characters escaped."""
    if len(value) > STORED_CHARS:
        value = f"{value[:STORED_CHARS]}… ({len(value)} characters)"
    return value.replace("\x00", "\\x00")


def _storable(value: JsonReadable | object) -> JsonValue:
    """Rejected parameters as JSON can hold them: NaN and infinities become their text, NUL
    characters (which PostgreSQL cannot store) their escape, a string past STORED_CHARS its
    beginning and its length."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return _storable_text(value)
    if isinstance(value, Mapping):
        return {str(_storable(k)): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value if value is None or isinstance(value, bool | int | float) else str(value)


# Wrong parameters or inputs: recorded as a failed job, so the history says why.
REJECTED = (ParamsError, PathError, ObjectURLError, StorageError, LookupError)


def _params_of(request: JobRequest) -> JobParams:
    """A request as its kind's stored parameters: the API's body and `mxq infer`'s request carry
    no field only mxq sets (a chunk's range, a schedule's fire), so those take their defaults;
    the API's body (a subclass: `api.schemas.ProbeJob`) also carries its routing, which is not
    stored."""
    spec = SPECS[request.job_kind]
    if type(request) is spec:
        return request
    values = {k: v for k, v in fields_of(request).items() if k in spec.model_fields}
    return spec.model_construct(request.model_fields_set, **values)  # type: ignore[arg-type]  # its own


def _prepare(settings: Settings, asked: Asked, models: Models) -> JobParams:
    """A request's stored parameters, with what the job will use pinned (model version, paths);
    ParamsError for a rejected request."""
    if isinstance(asked, Rejected):
        raise ParamsError(asked.reason)
    p = _params_of(asked)
    check_model_no_nul(p)
    if isinstance(p, InferParams):
        return resolve_infer(settings, p, models)
    if isinstance(p, TrainParams):
        return resolve_train(settings, p)
    return p


def _shown(asked: Asked) -> JsonObject:
    """What a failed job's row keeps of a request: its parameters as given, within bounds."""
    shown = _storable(asked.given if isinstance(asked, Rejected) else fields_of(_params_of(asked)))
    assert isinstance(shown, dict)
    return shown


def _checked_route(settings: Settings, device: str, allow_offline: bool) -> Route:
    """Check the device and the database; then where the job goes."""
    spec = parse_device(device)
    check_database(settings)
    return route(settings, spec, allow_offline)


def _need(kind: JobKind, p: JobParams, models: Models) -> Need:
    """The engine the prepared job cannot run without (`mxq.engines.needed`), in words."""
    if isinstance(p, InferParams):
        return need_of(p, models)
    return Need(needed(kind), JOBS_IN_WORDS[kind])


def _engine_route(settings: Settings, device: str, allow_offline: bool, need: Need,
                  where: Route) -> Route:
    """Where a job that needs one engine goes (`where` when it needs none)."""
    if need.engine is None:
        return where
    return route(settings, parse_device(device), allow_offline, need)


def _admitted(settings: Settings, ids: list[int], priority: Priority) -> list[Submitted]:
    """Held jobs, released now when their owner's quota and share allow it."""
    released = admit.admit(settings)
    if taken := [i for i in ids if i in released]:
        _ask_preemption(settings, priority, taken)
    return [Submitted(i, True) if i in released else Submitted(i, False, note=(
        f"job {i} is queued and held: its owner's quota or fair share admits it later "
        f"(`mxq job {i}` says why)")) for i in ids]


def _waiting(settings: Settings, ids: list[int], asked: Request, held: bool) -> list[Submitted]:
    """Jobs that wait for others (`--after`): released now when those all succeeded already
    (by the dependency pass, or by the admitter in its turn while admission is on)."""
    assert asked.after is not None
    released = dependencies.settle(settings).released + (admit.admit(settings) if held else [])
    if taken := [i for i in ids if i in released]:
        _ask_preemption(settings, asked.priority, taken)
    return [Submitted(i, True) if i in released else
            Submitted(i, False, note=dependencies.note(i, asked.after)) for i in ids]


def _unpublished(ids: list[int], exc: SubmitError) -> list[Submitted]:
    return [Submitted(i, False, note=(
        f"job {i} is queued but not published yet ({exc}); the reconciler publishes it "
        "once the broker answers")) for i in ids]


def _reject(settings: Settings, kind: JobKind, params: Asked, where: Route,
            exc: Exception, asked: Request, which: str = "") -> JobRejected:
    """Record a request that cannot run as a failed job (carrying no idempotency key: a retry
    is rejected again, on its own row); `which` names it within a batch."""
    reason = _storable_text(str(exc).strip('"'))
    job_id = create_job(settings.database, kind, _shown(params), where.requested, where.queue,
                        reason, owner=asked.owner, priority=asked.priority, team=asked.team)
    return JobRejected(job_id, f"{which}{reason}")


def _ask_preemption(settings: Settings, priority: Priority, ids: list[int]) -> None:
    """Ask a running job of a lower level to yield when the new jobs (the first of `ids`, the
    next to run) find their devices busy. They are queued whatever happens here: a failure is
    logged, and the reconciler's next pass asks again."""
    try:
        preempt.ask(settings, priority.level, ids[:preempt.AT_SUBMIT])
    except Exception:  # the submit succeeded; this is only the fast path of the reconciler's ask
        log.warning("preemption not asked at submit; the reconciler will", exc_info=True)


class BeyondQuota(UserError):
    """A job that needs more devices at once than its owner's quota allows: it could never run."""


def _check_quota(kind: JobKind, params: JsonObject, owner: str, share: Share) -> None:
    """Refuse at submit a job its owner's quota can never admit (it would be held for ever)."""
    why = beyond_quota(devices_needed(kind, params), share)
    if why is not None:
        raise BeyondQuota(f"{kind} job of {owner!r} refused: {why}")


def _trained_name(asked: Asked) -> str | None:
    """The model a training registers a version of (--name, else the --from NAME it retrains)."""
    values = asked.given if isinstance(asked, Rejected) else fields_of(asked)
    name = values.get("name") or values.get("from_model")
    return name if isinstance(name, str) else None


def _shared(settings: Settings, kind: JobKind, params: Sequence[Asked], owner: str,
            team: str | None) -> str | None:
    """The team jobs are shared with, checked (it exists, its owner is a member); a training
    only by an owner who may register versions of its model (Forbidden otherwise)."""
    checked = check_team(settings.database, team, owner)
    if kind == JobKind.TRAIN:
        for name in sorted({n for p in params if (n := _trained_name(p)) is not None}):
            check_registrant(settings.database, name, owner)
    return checked


def _prepare_all(settings: Settings, asked: Request, params: Sequence[Asked], where: Route,
                 models: Models) -> list[JobParams]:
    """Every job's parameters prepared (`_prepare`); the first wrong one is recorded as a failed
    job and raised (JobRejected), and nothing else is queued."""
    checked: list[JobParams] = []
    for i, p in enumerate(params):
        try:
            checked.append(_prepare(settings, p, models))
        except REJECTED as exc:
            which = f"job {i} of {len(params)} (nothing else was queued): " if len(params) > 1 else ""
            raise _reject(settings, asked.kind, p, where, exc, asked, which) from exc
    return checked


def _common_need(kind: JobKind, checked: list[JobParams], models: Models) -> Need:
    """The one engine every job of a submit_many needs (one queue serves them all)."""
    needs = {n.engine: n for n in (_need(kind, p, models) for p in checked)}
    engines = set(needs) - {None}
    if len(engines) > 1:
        raise ParamsError("these jobs need different engines (some MXNet, some ONNX Runtime): "
                          "submit each engine's jobs apart; nothing was queued")
    return needs[engines.pop()] if engines else Need()


@dataclass(frozen=True)
class _Planned:
    """A submit's jobs checked and prepared: their rows, where they go, their keys."""

    asked: Request
    rows: list[JsonObject]
    where: Route
    keys: list[str] | None


def _plan(settings: Settings, kind: JobKind, params: Sequence[Asked], options: SubmitOptions) -> _Planned:
    """Check everything a submit can check before it writes (the key, team, jobs waited for,
    device, database), prepare each job (a wrong one is recorded as failed: JobRejected), and
    refuse what the owner's quota can never admit."""
    if not params:
        raise ParamsError("no jobs to submit: give at least one")
    key, owner = check_key(options.idempotency_key), options.owner or local_owner()
    asked = Request(kind, owner, options.priority, _shared(settings, kind, params, owner, options.team),
                    dependencies.checked(settings, options.after, owner))
    where = _checked_route(settings, options.device, options.allow_offline)
    models: Models = {}
    checked = _prepare_all(settings, asked, params, where, models)
    rows = [stored(p) for p in checked]  # the one place the typed jobs become JSON
    share = admission.share_of(settings.database, owner)  # read once: a submit may hold 100,000
    for row in rows:
        _check_quota(kind, row, owner, share)
    where = _engine_route(settings, options.device, options.allow_offline,
                          _common_need(kind, checked, models), where)
    return _Planned(asked, rows, where, keys_of(key, len(checked)))


def _create(settings: Settings, plan: _Planned, held: bool) -> list[int] | list[Submitted]:
    """The jobs' rows, written in one transaction; the earlier jobs instead when a submit with
    the same key won the race."""
    asked, where = plan.asked, plan.where
    try:
        return create_jobs(settings.database, asked.kind, plan.rows, where.requested, where.queue,
                           asked.owner, asked.priority, held, asked.team, plan.keys, asked.after)
    except IdempotencyKeyTaken:  # a submit with the same key won the race
        assert plan.keys is not None
        if (earlier := replay(settings, plan.keys, asked, plan.rows, where)) is None:
            raise
        return earlier


def _release(settings: Settings, plan: _Planned, ids: list[int], held: bool) -> list[Submitted]:
    """The written jobs sent on their way: published now, or left to wait for the jobs they
    follow, for admission, or (broker refusing) for the reconciler."""
    asked = plan.asked
    if asked.after:
        return _waiting(settings, ids, asked, held)
    if held:
        return _admitted(settings, ids, asked.priority)
    try:
        publish_all(settings, asked.kind, plan.where.queue, ids, Turn(asked.priority.level))
    except SubmitError as exc:
        return _unpublished(ids, exc)
    _ask_preemption(settings, asked.priority, ids)
    return [Submitted(i, True) for i in ids]


def _submit(settings: Settings, kind: JobKind, params: Sequence[Asked],
            options: SubmitOptions) -> list[Submitted]:
    plan = _plan(settings, kind, params, options)
    if plan.keys is not None and (earlier := replay(settings, plan.keys, plan.asked, plan.rows,
                                                    plan.where)) is not None:
        return earlier  # before the broker is asked: a retry answers even while it hangs
    late, held = broker_late(settings), admit.holding(settings)
    ids = _create(settings, plan, held)
    if ids and isinstance(ids[0], Submitted):
        return [i for i in ids if isinstance(i, Submitted)]
    written = [i for i in ids if isinstance(i, int)]
    if late is not None:
        return _unpublished(written, late)
    return _release(settings, plan, written, held)


def submit_jobs(settings: Settings, requests: Sequence[JobRequest],
                options: SubmitOptions = DEFAULT_OPTIONS) -> list[Submitted]:
    """Queue jobs of one kind, each its kind's typed request (the model the API validates),
    owned by `options.owner` (default: `local:<login>`, this machine's user) and shared with its
    team, at its priority, each waiting for the jobs `after` to succeed (`dependencies`); what
    happened to each (`Submitted`). The one submit path: one job is a batch of one, and every
    answer is the same whatever the batch's size.

    Device and database problems, and a broker that refuses connections, write nothing; wrong
    parameters or inputs are recorded as a failed job (so the history says why) and raise
    JobRejected, and nothing else is queued. A broker that does not answer in time leaves the
    jobs queued, not published (the reconciler publishes them). An idempotency key makes a
    retry of the same request return its jobs (`idempotency.keys_of`), even while the broker hangs.
    """
    kinds = {r.job_kind for r in requests}
    if len(kinds) > 1:
        raise ParamsError(f"one kind of job per submit, not {', '.join(sorted(kinds))}")
    kind = kinds.pop() if kinds else JobKind.PROBE
    return _submit(settings, kind, requests, options)


def _typed(settings: Settings, kind: JobKind, given: Given) -> Asked:
    """A job as the pipeline takes it: options given as JSON read as the kind's request."""
    return request_of(kind, given, settings.limits) if isinstance(given, Mapping) else given


def submit_json(settings: Settings, kind: JobKind | str, params: Sequence[JsonMapping], device: str = "auto",
                allow_offline: bool = False, idempotency_key: str | None = None,
                owner: str | None = None, priority: Priority = Priority(),
                team: str | None = None, after: Sequence[int] | None = None) -> list[Submitted]:
    """`submit_jobs` of options given as JSON (a script's, a bench's): each read as its kind's
    request (`jobspecs.validate`, within `settings`' limits) where the submit prepares it, so
    options that do not fit are recorded as a failed job, as wrong inputs are."""
    known = known_kind(kind)
    return _submit(settings, known, [request_of(known, p, settings.limits) for p in params], SubmitOptions(
        device, allow_offline, idempotency_key, owner, priority, team, after))


def submit_request(settings: Settings, kind: JobKind | str, params: Given, device: str = "auto",
                   allow_offline: bool = False, idempotency_key: str | None = None,
                   owner: str | None = None, priority: Priority = Priority(),
                   team: str | None = None, after: Sequence[int] | None = None) -> Submitted:
    """Queue one job (`submit_jobs` with one): what happened to it."""
    known = known_kind(kind)
    [done] = _submit(settings, known, [_typed(settings, known, params)], SubmitOptions(
        device, allow_offline, idempotency_key, owner, priority, team, after))
    return done


def submit(settings: Settings, kind: JobKind | str, params: Given, device: str = "auto",
           allow_offline: bool = False, owner: str | None = None,
           priority: Priority = Priority(), team: str | None = None) -> int:
    """Queue one job and return its id (`submit_jobs`, for callers that need only the id:
    a job not published yet is queued all the same, and the reconciler publishes it)."""
    return submit_request(settings, kind, params, device, allow_offline, owner=owner,
                          priority=priority, team=team).job_id


def submit_many(settings: Settings, kind: JobKind | str, params: Sequence[Given], device: str = "auto",
                allow_offline: bool = False, owner: str | None = None,
                priority: Priority = Priority(), team: str | None = None) -> list[int]:
    """Queue many jobs of one kind and return their ids (`submit_jobs`: one check, one
    transaction, pipelined publishes)."""
    known = known_kind(kind)
    typed = [_typed(settings, known, p) for p in params]
    return [done.job_id for done in _submit(settings, known, typed, SubmitOptions(
        device, allow_offline, owner=owner, priority=priority, team=team))]
