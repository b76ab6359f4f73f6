"""Submit jobs: validate, write their rows, publish JSON messages that carry only job ids.

One path (`submit_jobs`) for one job and for many: a single submit is a batch of one, and both
answer alike. The rows come first, so a worker always finds its job. A broker that refuses
connections is found before anything is written; one that does not answer within
MXQ_BROKER_TIMEOUT_SECONDS (paused, frozen) leaves the rows `queued` without their messages,
the answer says so (`published` false), and the reconciler publishes them once the broker
answers. Wrong parameters are recorded as a failed job. An idempotency key makes a retry of the
same submit return the first jobs instead of new ones.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kombu import Connection
from kombu.utils.url import maybe_sanitize_url

from mxq.db.engine import ping, safe_url
from mxq.db.fleet import describe_groups, device_model, list_workers, model_groups
from mxq.db.jobs import IdempotencyKeyTaken, create_job, create_jobs
from mxq.db.records import (
    CLASSIFIER_OUTPUTS,
    HEADS,
    VALUE_OUTPUTS,
    JobRecord,
    ModelRecord,
    WorkerRecord,
)
from mxq.db.registry import check_registrant, find_arch, list_archs, resolve
from mxq.db.reports.history import jobs_by_keys
from mxq.db.sharing import admission
from mxq.db.sharing.teams import check_team
from mxq.device import Device
from mxq.engines import VARIANTS, disagreement, engine_problem, needed, plain_onnx, precision_problem
from mxq.errors import Conflict, JobRejected, UserError
from mxq.objects import ObjectURLError, check_output_prefix
from mxq.priorities import Priority
from mxq.shares import Share, beyond_quota, devices_needed
from mxq.users import local_owner
from mxq.workers.broker.app import app_for
from mxq.workers.broker.publish import BrokerTimeout, SubmitError, Turn, publish, task_name, within
from mxq.workers.broker.queues import parse_device
from mxq.workers.broker.routing import Need, Route, describe, route
from mxq.workers.jobs import admit, dependencies, preempt
from mxq.workers.jobs.jobspecs import (
    ARCHS,
    BUILTIN_DATASETS,
    SPECS,
    InferParams,
    JobParams,
    ParamsError,
    Raw,
    TrainParams,
    stored,
    validate,
)
from mxq.workers.paths import PathError
from mxq.workers.settings import Settings
from mxq.workers.storage.client import StorageError
from mxq.workers.storage.locate import allowed_url, identity, locate, size_of

log = logging.getLogger(__name__)

# An idempotency key comes from outside (a header, a flag): bounded, one line, no spaces; a UUID,
# a ULID or a base64 digest fits (the column holds 128 characters).
MAX_KEY_CHARS = 128
IDEMPOTENCY_KEY_PATTERN = rf"^[A-Za-z0-9._:+/=-]{{1,{MAX_KEY_CHARS}}}$"
PUBLISH_BATCH = 1000  # kombu's publish batch: submit_many's deadline is per batch
JOBS_IN_WORDS = {"train": "a training", "probe": "a probe", "register": "a model's registration",
                 "arch": "an architecture's trial"}


class IdempotencyConflict(Conflict):
    """The idempotency key was used before by a job with other parameters."""


@dataclass(frozen=True)
class Submitted:
    """What a submit did: the job, whether its message went out (None for a replay, which
    publishes nothing), whether it replayed an earlier submit with the same key, and a note
    saying either of those in words."""

    job_id: int
    published: bool | None
    replayed: bool = False
    note: str | None = None


def check_key(key: str | None) -> str | None:
    """The idempotency key, or a one-line ParamsError naming what is allowed."""
    if key is None or re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        return key
    shown = repr(key[:40]) + (f"... ({len(key)} characters)" if len(key) > 40 else "")
    raise ParamsError(f"idempotency key {shown} is not allowed: use 1 to 128 of the characters "
                      "A-Z a-z 0-9 . _ : + / = - (a UUID fits)")


def check_database(settings: Settings) -> None:
    """SubmitError when the database does not answer (nothing is written then)."""
    if (reason := ping(settings.database)) is not None:
        raise SubmitError(f"database unreachable at {safe_url(settings.database)}: {reason}")


def _connect(settings: Settings) -> None:
    seconds = settings.broker_timeout_seconds
    with Connection(settings.broker,  # type: ignore[no-untyped-call]  # kombu has no types
                    connect_timeout=seconds, transport_options={
                        "socket_timeout": seconds, "socket_connect_timeout": seconds}) as conn:
        conn.ensure_connection(max_retries=1, timeout=seconds)


def check_broker(settings: Settings) -> None:
    """SubmitError when the broker refuses (nothing is written then); BrokerTimeout when it
    does not answer within MXQ_BROKER_TIMEOUT_SECONDS."""
    try:
        within(settings.broker_timeout_seconds, "a connection check", settings.broker,
               lambda: _connect(settings))
    except BrokerTimeout:
        raise
    except Exception as exc:  # kombu raises several unrelated types here
        raise SubmitError(f"broker unreachable at {maybe_sanitize_url(settings.broker)}: {exc}") from exc


# The most of one rejected string a failed job's row keeps: a path of a megabyte is refused,
# not stored whole in the history.
STORED_CHARS = 1024


def _storable(value: Any) -> Any:
    """Rejected parameters as JSON can hold them: NaN and infinities become their text, NUL
    characters (which PostgreSQL cannot store) their escape, a string past STORED_CHARS its
    beginning and its length."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        if len(value) > STORED_CHARS:
            value = f"{value[:STORED_CHARS]}… ({len(value)} characters)"
        return value.replace("\x00", "\\x00")
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value


# Wrong parameters or inputs: recorded as a failed job, so the history says why.
REJECTED = (ParamsError, PathError, ObjectURLError, StorageError, LookupError)

Models = dict[tuple[str, int | None], ModelRecord]  # resolved once per submit_many


def _resolve_infer(settings: Settings, p: InferParams, models: Models) -> InferParams:
    """Pin the model version and the input path the job will use, within the input size limit."""
    name, _, version = p.model.partition(":")
    if version and not version.isdigit():
        raise ParamsError(f"model version {version!r} in {p.model!r} must be a number, "
                          "as in NAME:3")
    key = (name, int(version) if version else p.model_version)
    if key not in models:
        models[key] = resolve(settings.database, *key)
    model = models[key]
    models.setdefault((name, model["version"]), model)  # as the prepared job names it
    path = locate(settings, p.input)
    size = size_of(path)
    if size > settings.max_input_bytes:
        raise PathError(f"input {p.input} holds {size} bytes, more than the "
                        f"{settings.max_input_bytes} bytes allowed (MXQ_MAX_INPUT_BYTES)")
    return p.model_copy(update={"model": name, "model_version": model["version"], "input": str(path),
                                "input_identity": identity(path),
                                "output_to": check_against_model(settings, p, model)})


def check_against_model(settings: Settings, p: InferParams, model: ModelRecord) -> str | None:
    """What the request asks of the version (precision, output, engine) is what it has: a
    ParamsError otherwise, before anything is read. Returns the checked output prefix."""
    label = f"{model['name']}:{model['version']}"
    if (problem := precision_problem(p.precision, p.min_agreement, model["variants"], label,
                                     p.engine)) is not None:
        raise ParamsError(problem)
    _check_output_kind(p, model, label)
    if (problem := engine_problem(p.engine, model.get("onnx"), label)) is not None:
        raise ParamsError(problem)
    return _output_to(settings, p)


def _check_output_kind(p: InferParams, model: ModelRecord, label: str) -> None:
    """What the job asks of its output fits what the version outputs: SQL rows are a
    classifier's, a multi-label model's or one regression value's, top-k a classifier's or a
    multi-label model's, a threshold a multi-label model's."""
    kind = model.get("outputs") or "logits"
    if kind == HEADS:
        _check_heads(p, model, label)
        return
    one_value = kind == "regression" and model["classes"] == 1  # a row's `score` holds it
    if kind in VALUE_OUTPUTS and p.output in ("db", "both") and not one_value:
        raise ParamsError(f"--output {p.output}: {label} outputs {kind} values ({model['classes']} "
                          "per sample), which SQL rows (a class and a score) cannot hold; allowed: "
                          "--output npy or parquet (rows hold one regression value, as its score)")
    if kind in VALUE_OUTPUTS and p.top_k:
        raise ParamsError(f"--top-k {p.top_k}: {label} outputs {kind} values, not classes; "
                          "allowed: --top-k 0")
    if p.threshold is not None and kind != "multilabel":
        raise ParamsError(f"--threshold {p.threshold:g}: {label} outputs {kind}, not multi-label "
                          "probabilities; allowed: no --threshold")


def _check_heads(p: InferParams, model: ModelRecord, label: str) -> None:
    """A model with several outputs writes a file per output (.npy) or a column per output
    (Parquet); top-k and a threshold go with outputs that have classes or labels."""
    heads = model.get("heads") or []
    shown = ", ".join(f"{h['name']}={h['kind']}" for h in heads)
    if p.output in ("db", "both"):
        raise ParamsError(f"--output {p.output}: {label} has {len(heads)} outputs ({shown}), which "
                          "SQL rows (a class and a score) cannot hold; allowed: --output npy or parquet")
    if p.output == "npy" and p.output_to is not None:
        raise ParamsError(f"--output npy with output_to: {label} has {len(heads)} outputs, an .npy "
                          "each, kept on the worker's disk only; allowed: --output parquet with output_to")
    kinds = {h["kind"] for h in heads}
    if p.top_k and not kinds & {*CLASSIFIER_OUTPUTS, "multilabel"}:
        raise ParamsError(f"--top-k {p.top_k}: no output of {label} has classes ({shown}); "
                          "allowed: --top-k 0")
    if p.threshold is not None and "multilabel" not in kinds:
        raise ParamsError(f"--threshold {p.threshold:g}: no output of {label} is multi-label "
                          f"({shown}); allowed: no --threshold")


def _output_to(settings: Settings, p: InferParams) -> str | None:
    """The bucket prefix a Parquet output goes to, checked like an input (MXQ_S3_ALLOWED)."""
    where = p.output_to
    if where is None:
        return None
    if p.output not in ("parquet", "npy"):
        raise ParamsError(f"output_to {where[:120]!r} takes --output parquet or npy, not "
                          f"{p.output}: SQL rows are stored in the database")
    url = check_output_prefix(allowed_url(settings, where, "output_to"))
    return str(url).rstrip("/")


def _resolve_train(settings: Settings, p: TrainParams) -> TrainParams:
    """Pin the dataset path, and refuse more devices than the node has."""
    dataset = p.dataset
    if dataset not in BUILTIN_DATASETS:
        dataset = str(locate(settings, dataset, "dataset"))
    if p.min_agreement is not None and p.calibration is None:
        raise ParamsError("--min-agreement goes with --calibration (the variant it allows)")
    check_calibration(settings, p.calibration)
    if p.dist is not None:
        raise ParamsError("dist is set by a multi-node job's leader for its parts; "
                          "ask for nodes with --nodes N")
    if p.nodes > 1:
        _check_nodes(list_workers(settings.database, settings.heartbeat_ttl), p)
    else:
        _check_one_node(settings, p)
    return p.model_copy(update={"dataset": dataset, **_pinned_source(settings, p),
                                **pinned_code(settings.database, p.arch)})


def pinned_code(url: str, arch: str | None) -> dict[str, object]:
    """A registered architecture's code, pinned now: its newest version's checksum and factory,
    which every attempt imports and the version it trains records (a built-in: none)."""
    if arch is None or arch in ARCHS:
        return {"arch_sha256": None, "arch_factory": None}
    code = find_arch(url, arch)
    if code is None:
        known = [*ARCHS, *sorted({a["name"] for a in list_archs(url)})]
        raise ParamsError(f"unknown architecture {arch!r}; known: {', '.join(known)} "
                          "(`mxq arch add` registers your own)")
    return {"arch_sha256": code["sha256"], "arch_factory": code["factory"]}


def _pinned_source(settings: Settings, p: TrainParams) -> dict[str, object]:
    """A training --from NAME: the version it starts from, pinned now (the promoted one when none
    is named), so every attempt, and the version it registers, names the same graph."""
    if p.from_model is None:
        return {}
    source = resolve(settings.database, p.from_model, p.from_version)
    if source["symbol_file"] is None:
        how = "a plain ONNX file" if plain_onnx(source["onnx"]) else "registered without a symbol file"
        raise ParamsError(f"--from {p.from_model}:{source['version']}: the version has no MXNet "
                          f"graph to train ({how}); allowed: a version added with --arch or "
                          "--symbol/--params, or trained by mxq")
    if source["outputs"] not in CLASSIFIER_OUTPUTS:
        raise ParamsError(f"--from {p.from_model}:{source['version']}: the version outputs "
                          f"{source['outputs']} values, and mxq trains classifiers only; allowed: "
                          "a version whose outputs are logits or probabilities")
    return {"from_version": source["version"]}


def check_calibration(settings: Settings, where: str | None) -> None:
    """A training's calibration sample, confined and present now rather than after training."""
    if where is not None and where not in BUILTIN_DATASETS:
        locate(settings, where, "calibration file")


def _check_one_node(settings: Settings, p: TrainParams) -> None:
    """Refuse more devices than this node has of the kind, or a listed device it does not have
    (no worker known yet: the job waits for them)."""
    kind = Device.parse(p.device_list[0]).kind if p.device_list else None
    workers = [w for w in list_workers(settings.database, settings.heartbeat_ttl, settings.node)
               if kind is None or Device.parse(w["device"]).kind == kind]
    trainers = [w for w in workers if "mxnet" in w["engines"]]
    have = sorted(w["device"] for w in trainers)
    # Unless --device lists them, a training's devices are of one kind and one GPU model.
    most = max(Counter(device_model(w) for w in trainers).values(), default=0)
    if have and p.devices > most and not p.device_list:
        groups = describe_groups(model_groups(trainers))
        raise ParamsError(f"{p.devices} devices asked but node {settings.node} has {most} "
                          f"alike (one kind, one GPU model) that run MXNet ({groups}); "
                          "a training job runs on one node and never mixes GPU models unless "
                          "--device lists them")
    for device in p.device_list or []:
        if device not in have:
            raise ParamsError(_not_trainable(settings, device, workers, have))


def _not_trainable(settings: Settings, device: str, workers: list[WorkerRecord],
                   have: list[str]) -> str:
    """Why a listed device cannot take part in a training: unknown, or without MXNet."""
    worker = next((w for w in workers if w["device"] == device), None)
    if worker is None:
        return (f"device {device} is not known on node {settings.node}; "
                f"known: {', '.join(sorted(w['device'] for w in workers)) or 'none'}")
    return (f"device {describe(worker)} on node {settings.node} runs ONNX Runtime only, and a "
            f"training needs MXNet; devices that can: {', '.join(have) or 'none on this node'}")


def _check_nodes(known: list[WorkerRecord], p: TrainParams) -> None:
    """Refuse more nodes than have K devices of one kind and GPU model (no worker known yet: it
    waits)."""
    if not known:
        return
    per_node: dict[tuple[str, str], int] = {}
    for w in (w for w in known if "mxnet" in w["engines"]):
        key = (w["node"], device_model(w))
        per_node[key] = per_node.get(key, 0) + 1
    fit = {node for (node, _), n in per_node.items() if n >= p.devices}
    if len(fit) < p.nodes:
        have = ", ".join(f"{node} ({n} {model})" for (node, model), n in sorted(per_node.items()))
        raise ParamsError(f"{p.nodes} nodes with {p.devices} devices each asked "
                          f"but {len(fit)} nodes have that many; known: {have}")


def _prepare(settings: Settings, kind: str, params: Raw, models: Models) -> JobParams:
    """Validated parameters, with what the job will use pinned (model version, paths)."""
    p = validate(kind, params, settings)
    if isinstance(p, InferParams):
        return _resolve_infer(settings, p, models)
    if isinstance(p, TrainParams):
        return _resolve_train(settings, p)
    return p


def _checked_route(settings: Settings, kind: str, device: str, allow_offline: bool) -> Route:
    """Check the kind, the device and the database; then where the job goes."""
    if kind not in SPECS:
        raise ParamsError(f"unknown job kind {kind!r}; known kinds: {', '.join(SPECS)}")
    spec = parse_device(device)
    check_database(settings)
    return route(settings, spec, allow_offline)


def _need(kind: str, p: JobParams, models: Models) -> Need:
    """The engine the prepared job cannot run without (`mxq.engines.needed`), in words."""
    if not isinstance(p, InferParams):
        return Need(needed(kind), JOBS_IN_WORDS[kind])
    asked, model, precision = p.engine, models[(p.model, p.model_version)], p.precision
    engine = needed(kind, asked, model.get("onnx"), precision)
    if precision in VARIANTS and asked != engine:
        return Need(engine, f"inference with --precision {precision} (ONNX Runtime)")
    if engine is None or asked == engine:
        return Need(engine, f"inference with --engine {asked}")
    return Need(engine, f"inference of {p.model}:{p.model_version} "
                        f"({disagreement(model.get('onnx'))})")


def _engine_route(settings: Settings, device: str, allow_offline: bool, need: Need,
                  where: Route) -> Route:
    """Where a job that needs one engine goes (`where` when it needs none)."""
    if need.engine is None:
        return where
    return route(settings, parse_device(device), allow_offline, need)


@dataclass(frozen=True)
class Request:
    """What a submit asks for, beside its parameters: compared whole when a key is replayed."""

    kind: str
    owner: str
    priority: Priority
    team: str | None
    after: list[int] | None = None  # the jobs it waits for (`--after`)


def _same_request(record: JobRecord, asked: Request, params: Raw, where: Route) -> bool:
    """The stored job is what this request (its parameters prepared) would make: kind, device,
    parameters as JSON stores them, priority, preemptibility, team and the jobs it waits for."""
    return (record["kind"] == asked.kind and record["requested_device"] == where.requested
            and record["params"] == params
            and record["priority"] == asked.priority.level
            and record["preemptible"] == asked.priority.preemptible
            and record["team"] == asked.team and record["after"] == asked.after)


def _keys(key: str | None, count: int) -> list[str] | None:
    """Each job's idempotency key: the key itself for the first (or only) job, `KEY#i` for job i
    of a batch after it (`#` is not allowed in a key, so no user's key is ever one of these)."""
    if key is None:
        return None
    keys = [key] + [f"{key}#{i}" for i in range(1, count)]
    if len(keys[-1]) > MAX_KEY_CHARS:
        raise ParamsError(f"idempotency key of {len(key)} characters is too long for a batch of "
                          f"{count} jobs: at most {MAX_KEY_CHARS - len(keys[-1]) + len(key)}")
    return keys


def _replay(settings: Settings, keys: list[str], asked: Request, params: Sequence[Raw],
            where: Route) -> list[Submitted] | None:
    """The earlier jobs their owner made with these keys, when they are this request's;
    IdempotencyConflict when they are another request's (one more job or one fewer included);
    None when the key is new to this owner (keys are per owner: another user's key finds nothing
    of theirs)."""
    key = keys[0]
    records = jobs_by_keys(settings.database, [*keys, f"{key}#{len(keys)}"], asked.owner)
    if not records:
        return None
    if len(records) != len(params) or not all(
            _same_request(r, asked, p, where) for r, p in zip(records, params, strict=True)):
        raise IdempotencyConflict(
            f"idempotency key {key!r} was used by job {records[0]['id']} with other parameters; "
            "a retry must send the same request, a new job needs a new key")
    ids = ", ".join(str(r["id"]) for r in records)
    return [Submitted(r["id"], None, replayed=True,
                      note=f"a replay: job {ids} was submitted with idempotency key {key!r} "
                           "before; nothing new was queued") for r in records]


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


def _reject(settings: Settings, kind: str, params: Raw, where: Route,
            exc: Exception, asked: Request, which: str = "") -> JobRejected:
    """Record a request that cannot run as a failed job (carrying no idempotency key: a retry
    is rejected again, on its own row); `which` names it within a batch."""
    reason = _storable(str(exc).strip('"'))
    job_id = create_job(settings.database, kind, _storable(dict(params)), where.requested, where.queue,
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


def _check_quota(kind: str, params: Raw, owner: str, share: Share) -> None:
    """Refuse at submit a job its owner's quota can never admit (it would be held for ever)."""
    why = beyond_quota(devices_needed(kind, params), share)
    if why is not None:
        raise BeyondQuota(f"{kind} job of {owner!r} refused: {why}")


def _shared(settings: Settings, kind: str, params: Sequence[Raw], owner: str,
            team: str | None) -> str | None:
    """The team jobs are shared with, checked (it exists, its owner is a member); a training
    only by an owner who may register versions of its model (Forbidden otherwise)."""
    checked = check_team(settings.database, team, owner)
    if kind == "train":
        # (a training --from NAME with no name registers a version of NAME)
        for name in sorted({n for p in params if isinstance(n := p.get("name") or p.get("from_model"), str)}):
            check_registrant(settings.database, name, owner)
    return checked


def _prepare_all(settings: Settings, asked: Request, params: Sequence[Raw], where: Route,
                 models: Models) -> list[JobParams]:
    """Every job's parameters prepared (`_prepare`); the first wrong one is recorded as a failed
    job and raised (JobRejected), and nothing else is queued."""
    checked: list[JobParams] = []
    for i, p in enumerate(params):
        try:
            checked.append(_prepare(settings, asked.kind, p, models))
        except REJECTED as exc:
            which = f"job {i} of {len(params)} (nothing else was queued): " if len(params) > 1 else ""
            raise _reject(settings, asked.kind, p, where, exc, asked, which) from exc
    return checked


def _broker_late(settings: Settings) -> BrokerTimeout | None:
    """The broker checked before anything is written: SubmitError when it refuses; its
    BrokerTimeout when it does not answer in time (the jobs are then stored, not published)."""
    try:
        check_broker(settings)
    except BrokerTimeout as exc:
        return exc
    return None


def _publish(settings: Settings, kind: str, queue: str, ids: list[int], turn: Turn) -> None:
    """Each job's message, within MXQ_BROKER_TIMEOUT_SECONDS per publish batch; SubmitError
    when the broker refuses or does not answer (the jobs stay queued for the reconciler)."""
    if len(ids) == 1:
        publish(settings, ids[0], kind, queue, turn=turn)
        return
    try:
        within(settings.broker_timeout_seconds * -(-len(ids) // PUBLISH_BATCH),
               f"the publish of {len(ids)} jobs", settings.broker,
               lambda: _send_many(settings, kind, queue, ids, turn))
    except SubmitError:
        raise
    except Exception as exc:  # kombu raises several unrelated types here
        raise SubmitError(f"could not publish to {maybe_sanitize_url(settings.broker)}: {exc}") from exc


def submit_jobs(settings: Settings, kind: str, params: Sequence[Raw], device: str = "auto",
                allow_offline: bool = False, idempotency_key: str | None = None,
                owner: str | None = None, priority: Priority = Priority(),
                team: str | None = None, after: Sequence[int] | None = None) -> list[Submitted]:
    """Queue jobs of one kind, owned by `owner` (default: `local:<login>`, this machine's user)
    and shared with `team`, at `priority`, each waiting for the jobs `after` to succeed
    (`dependencies`); what happened to each (`Submitted`). The one submit
    path: one job is a batch of one, and every answer is the same whatever the batch's size.

    Device and database problems, and a broker that refuses connections, write nothing; wrong
    parameters or inputs are recorded as a failed job (so the history says why) and raise
    JobRejected, and nothing else is queued. A broker that does not answer in time leaves the
    jobs queued, not published (the reconciler publishes them). An idempotency key makes a
    retry of the same request return its jobs (`_keys`), even while the broker hangs.
    """
    if not params:
        raise ParamsError("no jobs to submit: give at least one")
    key, owner = check_key(idempotency_key), owner or local_owner()
    asked = Request(kind, owner, priority, _shared(settings, kind, params, owner, team),
                    dependencies.checked(settings, after, owner))
    where = _checked_route(settings, kind, device, allow_offline)
    models: Models = {}
    checked = _prepare_all(settings, asked, params, where, models)
    rows = [stored(p) for p in checked]  # the one place the typed jobs become JSON
    share = admission.share_of(settings.database, owner)  # read once: a submit may hold 100,000
    for row in rows:
        _check_quota(kind, row, owner, share)
    where = _engine_route(settings, device, allow_offline, _common_need(kind, checked, models), where)
    keys = _keys(key, len(checked))
    if keys is not None and (earlier := _replay(settings, keys, asked, rows, where)) is not None:
        return earlier  # before the broker is asked: a retry answers even while it hangs
    late, held = _broker_late(settings), admit.holding(settings)
    try:
        ids = create_jobs(settings.database, kind, rows, where.requested, where.queue,
                          owner, priority, held, asked.team, keys, asked.after)
    except IdempotencyKeyTaken:  # a submit with the same key won the race
        assert keys is not None
        if (earlier := _replay(settings, keys, asked, rows, where)) is None:
            raise
        return earlier
    if late is not None:
        return _unpublished(ids, late)
    if asked.after:
        return _waiting(settings, ids, asked, held)
    if held:
        return _admitted(settings, ids, priority)
    try:
        _publish(settings, kind, where.queue, ids, Turn(priority.level))
    except SubmitError as exc:
        return _unpublished(ids, exc)
    _ask_preemption(settings, priority, ids)
    return [Submitted(i, True) for i in ids]


def submit_request(settings: Settings, kind: str, params: Raw, device: str = "auto",
                   allow_offline: bool = False, idempotency_key: str | None = None,
                   owner: str | None = None, priority: Priority = Priority(),
                   team: str | None = None, after: Sequence[int] | None = None) -> Submitted:
    """Queue one job (`submit_jobs` with one): what happened to it."""
    [done] = submit_jobs(settings, kind, [params], device, allow_offline, idempotency_key, owner,
                         priority, team, after)
    return done


def submit(settings: Settings, kind: str, params: Raw, device: str = "auto",
           allow_offline: bool = False, owner: str | None = None,
           priority: Priority = Priority(), team: str | None = None) -> int:
    """Queue one job and return its id (`submit_jobs`, for callers that need only the id:
    a job not published yet is queued all the same, and the reconciler publishes it)."""
    return submit_request(settings, kind, params, device, allow_offline, owner=owner,
                          priority=priority, team=team).job_id


def submit_many(settings: Settings, kind: str, params: Sequence[Raw], device: str = "auto",
                allow_offline: bool = False, owner: str | None = None,
                priority: Priority = Priority(), team: str | None = None) -> list[int]:
    """Queue many jobs of one kind and return their ids (`submit_jobs`: one check, one
    transaction, pipelined publishes)."""
    return [done.job_id for done in submit_jobs(settings, kind, params, device, allow_offline,
                                                owner=owner, priority=priority, team=team)]


def _common_need(kind: str, checked: list[JobParams], models: Models) -> Need:
    """The one engine every job of a submit_many needs (one queue serves them all)."""
    needs = {n.engine: n for n in (_need(kind, p, models) for p in checked)}
    engines = set(needs) - {None}
    if len(engines) > 1:
        raise ParamsError("these jobs need different engines (some MXNet, some ONNX Runtime): "
                          "submit each engine's jobs apart; nothing was queued")
    return needs[engines.pop()] if engines else Need()


def _send_many(settings: Settings, kind: str, queue: str, ids: list[int], turn: Turn) -> None:
    """One pipelined round trip per 1,000 messages (kombu's publish batch) instead of one each."""
    app = app_for(settings)
    with app.producer_or_acquire() as producer, producer.batch():
        for job_id in ids:
            app.send_task(task_name(kind), args=[job_id], queue=queue, task_id=f"job-{job_id}",
                          producer=producer, priority=turn.broker_priority)
