"""Submit a job: validate, write its row, publish a JSON message that carries only the job id.

The row comes first, so a worker always finds it; if the message cannot be published the row is
removed again, so a failed submit leaves nothing half-written.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from kombu import Connection
from kombu.utils.url import maybe_sanitize_url
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from mxq.db.engine import get_engine, safe_url
from mxq.db.fleet import list_workers
from mxq.db.jobs import create_job, create_jobs
from mxq.db.records import ModelRecord, WorkerRecord
from mxq.db.registry import resolve
from mxq.device import Device
from mxq.errors import JobRejected
from mxq.workers.app import app_for
from mxq.workers.jobspecs import SPECS, ParamsError, validate
from mxq.workers.paths import PathError, confine
from mxq.workers.publish import SubmitError, publish, task_name
from mxq.workers.queues import parse_device
from mxq.workers.routing import Route, route
from mxq.workers.settings import Settings

BROKER_CHECK_SECONDS = 3


def check_database(settings: Settings) -> None:
    try:
        with get_engine(settings.database).connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise SubmitError(f"database unreachable at {safe_url(settings.database)}: {reason}") \
            from None


def check_broker(settings: Settings) -> None:
    try:
        with Connection(settings.broker,  # type: ignore[no-untyped-call]  # kombu has no types
                        connect_timeout=BROKER_CHECK_SECONDS) as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_CHECK_SECONDS)
    except Exception as exc:  # kombu raises several unrelated types here
        raise SubmitError(f"broker unreachable at {maybe_sanitize_url(settings.broker)}: {exc}") from None


def _storable(value: Any) -> Any:
    """Rejected parameters as JSON can hold them: NaN and infinities become their text, NUL
    characters (which PostgreSQL cannot store) their escape."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.replace("\x00", "\\x00")
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value


def _input_bytes(path: Path) -> int:
    """The size of an input: a file, or the files directly inside a folder (an image folder)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


Models = dict[tuple[str, int | None], ModelRecord]  # resolved once per submit_many


def _resolve_infer(settings: Settings, params: dict[str, Any], models: Models) -> dict[str, Any]:
    """Pin the model version and the input path the job will use, within the input size limit."""
    name, _, version = params["model"].partition(":")
    if version and not version.isdigit():
        raise ParamsError(f"model version {version!r} in {params['model']!r} must be a number, "
                          "as in NAME:3")
    key = (name, int(version) if version else params["model_version"])
    if key not in models:
        models[key] = resolve(settings.database, *key)
    model = models[key]
    path = confine(settings, params["input"])
    size = _input_bytes(path)
    if size > settings.max_input_bytes:
        raise PathError(f"input {params['input']} holds {size} bytes, more than the "
                        f"{settings.max_input_bytes} bytes allowed (MXQ_MAX_INPUT_BYTES)")
    return {**params, "model": name, "model_version": model["version"], "input": str(path)}


def _resolve_train(settings: Settings, params: dict[str, Any], _models: Models) -> dict[str, Any]:
    """Pin the dataset path, and refuse more devices than the node has."""
    dataset = params["dataset"]
    if dataset != "digits":
        dataset = str(confine(settings, dataset, "dataset"))
    if params.get("dist") is not None:
        raise ParamsError("dist is set by a multi-node job's leader for its parts; "
                          "ask for nodes with --nodes N")
    if params["nodes"] > 1:
        _check_nodes(list_workers(settings.database, settings.heartbeat_ttl), params)
        return {**params, "dataset": dataset}
    _check_one_node(settings, params)
    return {**params, "dataset": dataset}


def _check_one_node(settings: Settings, params: dict[str, Any]) -> None:
    """Refuse more devices than this node has of the kind, or a listed device it does not have
    (no worker known yet: the job waits for them)."""
    kind = Device.parse(params["device_list"][0]).kind if params["device_list"] else None
    workers = list_workers(settings.database, settings.heartbeat_ttl, settings.node)
    have = sorted(w["device"] for w in workers if kind is None or Device.parse(w["device"]).kind == kind)
    most = max(Counter(Device.parse(d).kind for d in have).values(), default=0)
    if have and params["devices"] > most:
        raise ParamsError(f"{params['devices']} devices asked but node {settings.node} has {most} "
                          f"({', '.join(have) or 'none'}); a training job runs on one node")
    for device in params["device_list"] or []:
        if device not in have:
            raise ParamsError(f"device {device} is not known on node {settings.node}; "
                              f"known: {', '.join(have) or 'none'}")


def _check_nodes(known: list[WorkerRecord], params: dict[str, Any]) -> None:
    """Refuse more nodes than have K devices of one kind (no worker known yet: it waits)."""
    if not known:
        return
    per_node: dict[tuple[str, str], int] = {}
    for w in known:
        key = (w["node"], Device.parse(w["device"]).kind)
        per_node[key] = per_node.get(key, 0) + 1
    fit = {node for (node, _), n in per_node.items() if n >= params["devices"]}
    if len(fit) < params["nodes"]:
        have = ", ".join(f"{node} ({n} {kind})" for (node, kind), n in sorted(per_node.items()))
        raise ParamsError(f"{params['nodes']} nodes with {params['devices']} devices each asked "
                          f"but {len(fit)} nodes have that many; known: {have}")


PREPARE = {"infer": _resolve_infer, "train": _resolve_train}


def _prepare(settings: Settings, kind: str, params: dict[str, Any], models: Models) -> dict[str, Any]:
    """Validated parameters, with what the job will use pinned (model version, paths)."""
    params = validate(kind, params, settings)
    return PREPARE[kind](settings, params, models) if kind in PREPARE else params


def _reachable_route(settings: Settings, kind: str, device: str, allow_offline: bool) -> Route:
    """Check the kind, the device, the database and the broker; then where the job goes."""
    if kind not in SPECS:
        raise ParamsError(f"unknown job kind {kind!r}; known kinds: {', '.join(SPECS)}")
    spec = parse_device(device)
    check_database(settings)
    check_broker(settings)
    return route(settings, spec, allow_offline)


def submit(settings: Settings, kind: str, params: dict[str, Any], device: str = "auto",
           allow_offline: bool = False) -> int:
    """Queue one job and return its id.

    Device, broker and database problems write nothing; wrong parameters or inputs are recorded
    as a failed job (so the history says why) and raise JobRejected.
    """
    where = _reachable_route(settings, kind, device, allow_offline)
    try:
        params = _prepare(settings, kind, params, {})
    except (ParamsError, PathError, LookupError) as exc:
        reason = _storable(str(exc).strip('"'))
        job_id = create_job(settings.database, kind, _storable(params), where.requested, where.queue,
                            reason)
        raise JobRejected(job_id, reason) from None
    job_id = create_job(settings.database, kind, params, where.requested, where.queue)
    publish(settings, job_id, kind, where.queue, undo_on_failure=True)
    return job_id


def submit_many(settings: Settings, kind: str, params: list[dict[str, Any]], device: str = "auto",
                allow_offline: bool = False) -> list[int]:
    """Queue many jobs of one kind at once: one check, one transaction, pipelined publishes.

    All or nothing: if any parameters are wrong, nothing is written and the error names which.
    """
    where = _reachable_route(settings, kind, device, allow_offline)
    checked: list[dict[str, Any]] = []
    models: Models = {}
    for i, p in enumerate(params):
        try:
            checked.append(_prepare(settings, kind, p, models))
        except (ParamsError, PathError, LookupError) as exc:
            raise ParamsError(f"job {i} of {len(params)}: {str(exc).strip(chr(34))}; nothing was "
                              "queued") from None
    ids = create_jobs(settings.database, kind, checked, where.requested, where.queue)
    app = app_for(settings.broker)
    try:
        # One pipelined round trip per 1,000 messages (kombu's publish batch) instead of one each.
        with app.producer_or_acquire() as producer, producer.batch():
            for job_id in ids:
                app.send_task(task_name(kind), args=[job_id], queue=where.queue,
                              task_id=f"job-{job_id}", producer=producer)
    except Exception as exc:
        raise SubmitError(f"could not publish to {maybe_sanitize_url(settings.broker)}: {exc}; "
                          "the reconciler publishes the jobs already recorded") from None
    return ids
