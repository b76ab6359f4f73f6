"""Heartbeats of the worker processes, one row per device worker: the live routing table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from mxq.db.engine import rowcount, session_scope
from mxq.db.records import Health, WorkerRecord
from mxq.db.retry import db_retry
from mxq.db.schema import Job, WorkerBeat, as_utc, iso, utcnow
from mxq.db.webhooks import outbox
from mxq.device import Device
from mxq.engines import RUNTIMES
from mxq.json_types import JsonObject
from mxq.status import JobStatus

# What `refuse` adds to a worker's info: why its device is out and since when (ISO, UTC). A
# registration (the launcher's, or the worker's own once its device passed its start check)
# drops both, so a healed device reads healthy and its old reason does not linger.
# What `hold_out` adds besides: why the launcher planned no worker for the device (refused at
# planning: `memory_in_use`, `mig`, ...; `missing` from nvidia-smi), mxq.workers.hardware.unplanned.
UNPLANNED_KEY = "unplanned"
REFUSAL_KEYS = ("refused", "refused_at", UNPLANNED_KEY)
# What a GPU worker's heartbeat read of its GPU through NVML (mxq.workers.fleet.nvml): replaced
# at each registration (a new worker reads afresh), kept while the device is out (why it went).
NVML_KEY = "nvml"
STATE_KEYS = (*REFUSAL_KEYS, NVML_KEY)  # what a row says of its device's state, not its figures


@db_retry
def register(url: str, name: str, node: str, device: str, queue: str, pid: int | None,
             info: dict[str, Any], alive: bool = True, engines: tuple[str, ...] | None = None,
             nvml: JsonObject | None = None) -> None:
    """Insert or refresh a worker's row; `alive` says it consumes from now on, `engines` what its
    device runs (kept when not given), `nvml` what NVML says of its GPU now. A device that was
    out (its worker refused it) and whose worker now starts consuming is back: a `device.back`
    webhook, in the same transaction."""
    now = utcnow()
    with session_scope(url) as session:
        row = session.get(WorkerBeat, name) or WorkerBeat(name=name)
        was = row.info or {}
        if alive and was.get("refused"):  # out until now: its worker took it again
            outbox.emit(session, "device.back", {"device": {
                "worker": name, "node": node, "device": device, "out_reason": was["refused"],
                "out_since": was.get("refused_at"), "back_at": iso(now), NVML_KEY: nvml,
                UNPLANNED_KEY: was.get(UNPLANNED_KEY)}})
        row.node, row.device, row.queue, row.pid = node, device, queue, pid
        row.info = {k: v for k, v in (info or row.info or {}).items()
                    if k not in STATE_KEYS} | ({NVML_KEY: nvml} if nvml else {})
        if engines is not None:
            row.engines = ",".join(engines)
        row.started_at, row.last_seen, row.current_job = now, now if alive else None, None
        session.add(row)


@db_retry
def beat(url: str, name: str, current_job: int | None, nvml: JsonObject | None = None) -> bool:
    """Refresh the worker's heartbeat and its running job's, in one transaction (a fleet of 1,000
    devices beats 500 times a second), with what NVML says of its GPU when that changed (`nvml`,
    else None: no read of the row); False when that job is not running on this worker any more
    (finished, or failed or cancelled by the reconciler)."""
    now = utcnow()
    with session_scope(url) as session:
        session.execute(update(WorkerBeat).where(WorkerBeat.name == name)
                        .values(last_seen=now, current_job=current_job))
        if nvml is not None and (row := session.get(WorkerBeat, name)) is not None:
            row.info = {**(row.info or {}), NVML_KEY: nvml}
        if current_job is None:
            return True
        return bool(rowcount(session.execute(
            update(Job).where(Job.id == current_job, Job.worker == name,
                              Job.status == JobStatus.RUNNING).values(heartbeat_at=now))))


@db_retry
def refuse(url: str, name: str, reason: str) -> None:
    """The worker refused its device (its start check failed, or the device faulted during a
    job): offline, its device `out`, with the reason and when (`refused`, `refused_at`) kept in
    its info until it registers again (`mxq devices`, `/metrics`, `mxq queue` show them). A
    refusal again (the launcher's next probe) updates the reason and keeps the first time."""
    with session_scope(url) as session:
        row = session.get(WorkerBeat, name)
        if row is not None:
            info = row.info or {}
            since = _out_since(info)
            row.last_seen, row.current_job = None, None
            kept = {k: v for k, v in info.items() if k != UNPLANNED_KEY}  # its worker refused it now
            row.info = {**kept, "refused": reason, "refused_at": since or iso(utcnow())}
            if since is None:  # out now, not a refusal again of a device out already
                _tell_out(session, row, reason)


def _out_since(info: dict[str, Any]) -> str | None:
    """Since when a row's device has been out (ISO), None where it is not out."""
    return info.get("refused_at") if info.get("refused") else None


def _tell_out(session: Session, row: WorkerBeat, reason: str) -> None:
    """`device.out`, once per outage: only where the row was not out already (a probe that fails
    again, or a launcher restarted by Compose, tells nothing new)."""
    info = row.info or {}
    outbox.emit(session, "device.out", {"device": {
        "worker": row.name, "node": row.node, "device": row.device, "reason": reason,
        "since": info["refused_at"], NVML_KEY: info.get(NVML_KEY),
        UNPLANNED_KEY: info.get(UNPLANNED_KEY)}})


@db_retry
def hold_out(url: str, name: str, node: str, device: str, queue: str, info: dict[str, Any],
             cause: str, reason: str) -> None:
    """A device the launcher planned no worker for (`cause`: refused at planning, or missing
    from nvidia-smi): its row, `out` with `reason` (`info` what nvidia-smi said of it; a missing
    GPU's row keeps what it knew), and `device.out` unless it was out already. Planned again and
    still held, the reason is updated and its first time kept, as `refuse` does."""
    with session_scope(url) as session:
        row = session.get(WorkerBeat, name) or WorkerBeat(name=name, node=node, device=device,
                                                         queue=queue, info={})
        was = row.info or {}
        since = _out_since(was)
        row.node, row.device, row.queue, row.pid = node, device, queue, None
        row.last_seen, row.current_job, row.engines = None, None, ""
        row.info = {**was, **info, "refused": reason, "refused_at": since or iso(utcnow()),
                    UNPLANNED_KEY: cause}
        session.add(row)
        if since is None:
            _tell_out(session, row, reason)


@db_retry
def describe(url: str, name: str, info: dict[str, Any]) -> None:
    """Replace what a worker's row says of its device (nvidia-smi's figures when its worker was
    planned), keeping whether and why it is out: a held GPU planned again keeps `out` until its
    worker takes it, which tells `device.back`."""
    with session_scope(url) as session:
        row = session.get(WorkerBeat, name)
        if row is not None:
            kept = {k: v for k, v in (row.info or {}).items() if k in STATE_KEYS}
            row.info = {**info, **kept}


def node_gpus(url: str, node: str) -> dict[str, dict[str, Any]]:
    """What this node's rows remember of each GPU (device label -> info: `uuid`, `name`), also
    of GPUs it no longer lists: how a missing GPU is named."""
    with session_scope(url) as session:
        rows = session.scalars(select(WorkerBeat).where(WorkerBeat.node == node,
                                                        WorkerBeat.device.like("gpu:%")))
        return {r.device: dict(r.info or {}) for r in rows}


def health(alive: bool, info: Mapping[str, Any] | None) -> tuple[Health, str | None, str | None]:
    """A device's health from its worker's state: (health, out_reason, out_since). `healthy`
    while its worker beats (alive wins over an old refusal), `out` when its worker refused it
    (`refuse`) and does not beat, else `offline` (stopped, or never started)."""
    if alive:
        return "healthy", None, None
    reason = (info or {}).get("refused")
    if not reason:
        return "offline", None, None
    since = (info or {}).get("refused_at")
    return "out", str(reason), str(since) if since else None


def out_note(reason: str | None, since: str | None, now: datetime | None = None,
             unplanned: object = None) -> str:
    """`out since 12:03 UTC: REASON` (the date too when not today; no time for a refusal
    recorded before its time was): how `mxq devices` and `mxq queue` say a device is out; `out
    (missing)` or `out (refused at planning: mig)` for a GPU the launcher planned no worker for."""
    when = ""
    if since:
        at = datetime.fromisoformat(since).astimezone(UTC)
        today = (now or utcnow()).astimezone(UTC).date() == at.date()
        when = at.strftime(" since %H:%M UTC" if today else " since %Y-%m-%d %H:%M UTC")
    held = "" if not unplanned else (" (missing)" if unplanned == "missing"
                                     else f" (refused at planning: {unplanned})")
    return f"out{held}{when}: {reason or 'its device failed its check'}"


def gpu_model(worker: Mapping[str, Any]) -> str | None:
    """The GPU model a GPU worker's row names (nvidia-smi's `name`): what a training's devices
    must share. None for a CPU (its row names each CPU device apart, `CPU device 0`) or a row
    that does not say."""
    if not Device.parse(worker["device"]).is_gpu:
        return None
    return (worker.get("info") or {}).get("name")


def device_model(worker: Mapping[str, Any]) -> str:
    """What a training's devices must share, as said to a user: a GPU's model (`model unknown`
    where its row does not say), else the device's kind (`cpu`)."""
    kind = Device.parse(worker["device"]).kind
    return gpu_model(worker) or ("model unknown" if kind == "gpu" else kind)


def model_groups(workers: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The workers' devices by `device_model`, each in index order: how a refusal names them
    (`describe_groups`)."""
    groups: dict[str, list[str]] = {}
    for w in sorted(workers, key=lambda w: Device.parse(w["device"])):
        groups.setdefault(device_model(w), []).append(w["device"])
    return groups


def describe_groups(groups: dict[str, list[str]]) -> str:
    """`model_groups` as a refusal names them: `NVIDIA A100: gpu:0, gpu:1; NVIDIA L4: gpu:2`."""
    return "; ".join(f"{model}: {', '.join(devices)}" for model, devices in groups.items()) or "none"


def gpu_memory(record: Mapping[str, Any]) -> str:
    """`31000/81920 MiB`: a GPU's memory in use, from a device record's `memory_used_mib` and
    `memory_total_mib` (NVML's at the last stored beat where its worker reads NVML, else
    nvidia-smi's when the launcher planned it: mxq.workers.fleet.device_table); "" for a device
    without the figures (a CPU)."""
    used, total = record.get("memory_used_mib"), record.get("memory_total_mib")
    return "" if used is None or total is None else f"{used}/{total} MiB"


def refused_since(url: str, names: list[str], since: datetime) -> dict[str, str]:
    """Which of `names` were registered after `since` and have refused their device, with why."""
    with session_scope(url) as session:
        rows = session.scalars(select(WorkerBeat).where(WorkerBeat.name.in_(names)))
        return {r.name: str(r.info["refused"]) for r in rows
                if r.started_at and as_utc(r.started_at) >= since and (r.info or {}).get("refused")}


@db_retry
def mark_dead(url: str, name: str) -> None:
    """The worker stopped or died: it is offline from now on."""
    with session_scope(url) as session:
        session.execute(update(WorkerBeat).where(WorkerBeat.name == name)
                        .values(last_seen=None, current_job=None))


def list_workers(url: str, ttl: float, node: str | None = None) -> list[WorkerRecord]:
    """Every known device worker with `alive` decided by heartbeat age, and its device's
    `health` (`health`)."""
    now = utcnow()
    q = select(WorkerBeat).order_by(WorkerBeat.node, WorkerBeat.device)
    if node is not None:
        q = q.where(WorkerBeat.node == node)
    with session_scope(url) as session:
        rows = list(session.scalars(q))
    out: list[WorkerRecord] = []
    for r in rows:
        seen = as_utc(r.last_seen)
        age = (now - seen).total_seconds() if seen else None
        alive = age is not None and age < ttl
        state, reason, since = health(alive, r.info)
        out.append({
            "name": r.name, "node": r.node, "device": r.device, "queue": r.queue, "pid": r.pid,
            "alive": alive,
            "heartbeat_age": age, "last_seen": seen.isoformat() if seen else None,
            "current_job": r.current_job, "info": r.info, "started_at": iso(r.started_at),
            "engines": engines_of(r.engines),
            "health": state, "out_reason": reason, "out_since": since,
        })
    return out


def engines_of(column: str | None) -> list[str]:
    """The engines a worker row says its device runs (every one when it does not say: a row
    written before they were recorded)."""
    return list(RUNTIMES) if column is None else [e for e in column.split(",") if e]


def alive_since(url: str, names: list[str], since: datetime, ttl: float) -> set[str]:
    """Which of `names` have registered after `since` and beat within `ttl`."""
    cutoff = utcnow() - timedelta(seconds=ttl)
    with session_scope(url) as session:
        rows = session.scalars(select(WorkerBeat).where(WorkerBeat.name.in_(names)))
        return {r.name for r in rows
                if r.last_seen and r.started_at and as_utc(r.started_at) >= since
                and as_utc(r.last_seen) >= cutoff}


def forget(url: str, name: str) -> None:
    """Drop a worker's row: a device that is gone for good leaves the routing table."""
    with session_scope(url) as session:
        session.query(WorkerBeat).filter(WorkerBeat.name == name).delete()


def kinds(url: str, ttl: float, wanted: tuple[str, ...],
          engine: str | None = None) -> tuple[set[str], set[str]]:
    """Which of the device kinds `wanted` have a live worker (with `engine`, when given), and
    which have any: what routing an `auto` job needs, asked of SQL (reading every worker's row
    for it cost a fleet of 1,000 devices tens of milliseconds a submit)."""
    cutoff = utcnow() - timedelta(seconds=ttl)
    live, known = set(), set()
    runs = [or_(WorkerBeat.engines.is_(None), WorkerBeat.engines.like(f"%{engine}%"))] if engine else []
    with session_scope(url) as session:
        for kind in wanted:
            seen = session.execute(select(func.count(), func.max(WorkerBeat.last_seen))
                                   .where(WorkerBeat.device.like(f"{kind}:%"), *runs)).one()
            if seen[0]:
                known.add(kind)
            if seen[1] is not None and as_utc(seen[1]) >= cutoff:
                live.add(kind)
    return live, known
