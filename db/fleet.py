"""Heartbeats of the worker processes, one row per device worker: the live routing table."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update

from mxq.db.engine import rowcount, session_scope
from mxq.db.records import WorkerRecord
from mxq.db.retry import db_retry
from mxq.db.schema import Job, WorkerBeat, as_utc, iso, utcnow
from mxq.engines import RUNTIMES
from mxq.status import JobStatus


@db_retry
def register(url: str, name: str, node: str, device: str, queue: str, pid: int | None,
             info: dict[str, Any], alive: bool = True, engines: tuple[str, ...] | None = None) -> None:
    """Insert or refresh a worker's row; `alive` says it consumes from now on, `engines` what its
    device runs (kept when not given)."""
    now = utcnow()
    with session_scope(url) as session:
        row = session.get(WorkerBeat, name) or WorkerBeat(name=name)
        row.node, row.device, row.queue, row.pid = node, device, queue, pid
        row.info = info or row.info or {}
        if engines is not None:
            row.engines = ",".join(engines)
        row.started_at, row.last_seen, row.current_job = now, now if alive else None, None
        session.add(row)


@db_retry
def beat(url: str, name: str, current_job: int | None) -> bool:
    """Refresh the worker's heartbeat and its running job's, in one transaction (a fleet of 1,000
    devices beats 500 times a second); False when that job is not running on this worker any
    more (finished, or failed or cancelled by the reconciler)."""
    now = utcnow()
    with session_scope(url) as session:
        session.execute(update(WorkerBeat).where(WorkerBeat.name == name)
                        .values(last_seen=now, current_job=current_job))
        if current_job is None:
            return True
        return bool(rowcount(session.execute(
            update(Job).where(Job.id == current_job, Job.worker == name,
                              Job.status == JobStatus.RUNNING).values(heartbeat_at=now))))


@db_retry
def refuse(url: str, name: str, reason: str) -> None:
    """The worker refused its device (MXNet cannot use it) and will not be restarted: offline,
    with the reason kept in its info (shown by `mxq devices`) until a launcher registers it anew."""
    with session_scope(url) as session:
        row = session.get(WorkerBeat, name)
        if row is not None:
            row.last_seen, row.current_job = None, None
            row.info = {**(row.info or {}), "refused": reason}


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
    """Every known device worker with `alive` decided by heartbeat age."""
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
        out.append({
            "name": r.name, "node": r.node, "device": r.device, "queue": r.queue, "pid": r.pid,
            "alive": age is not None and age < ttl,
            "heartbeat_age": age, "last_seen": seen.isoformat() if seen else None,
            "current_job": r.current_job, "info": r.info, "started_at": iso(r.started_at),
            "engines": engines_of(r.engines),
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
