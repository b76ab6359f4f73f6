"""The fleet case's server-side roles, each a process of its own: the real reconciler every pass,
and the dashboard's polls with the history queries timed beside them; each logs JSON lines.

    python -m bench.fleet.roles reconciler|poll --log FILE [--api URL] [--history N]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from bench.fleet import history as fleet_history
from mxq.db.engine import session_scope
from mxq.db.schema import Job
from mxq.status import JobStatus
from mxq.workers.repair.reconcile import reconcile
from mxq.workers.settings import get_settings

POLL_SECONDS = 2.0  # the dashboard's refresh




def reconciler_role(log: Path) -> None:
    """The real reconciler, every MXQ_RECONCILE_SECONDS; each pass's time and queued jobs logged."""
    s = get_settings()
    stop = _stop_on_term()
    with log.open("a", buffering=1) as out:
        while not stop():
            t = time.perf_counter()
            try:
                with session_scope(s.database) as session:
                    queued = session.scalar(select(func.count()).select_from(Job)
                                            .where(Job.status == JobStatus.QUEUED)) or 0
                t = time.perf_counter()
                report = reconcile(s)
                out.write(json.dumps({"t": time.time(), "pass_s": time.perf_counter() - t,
                                      "queued": queued, "actions": {
                                          k: len(v) for k, v in vars(report).items() if v}}) + "\n")
            except Exception as exc:  # a broker restart: the next pass goes on, as Celery's would
                print(f"reconcile failed: {exc}", file=sys.stderr, flush=True)
            _sleep(stop, s.reconcile_seconds - (time.perf_counter() - t))


def poll_role(log: Path, api: str, history: int) -> None:
    """The dashboard's two requests every 2 s, and one round of the history queries."""
    s = get_settings()
    stop = _stop_on_term()
    asked = fleet_history.queries(s.database, history)
    with log.open("a", buffering=1) as out, httpx.Client(base_url=api + "/api/v1", timeout=60) as client:
        while not stop():
            t0 = time.perf_counter()
            try:
                _poll_once(client, asked, out)
            except Exception as exc:  # the server refused a connection: poll again next time
                print(f"poll failed: {exc}", file=sys.stderr, flush=True)
            _sleep(stop, POLL_SECONDS - (time.perf_counter() - t0))


def _poll_once(client: httpx.Client, asked: dict[str, Any], out: Any) -> None:
    for path, params in (("/devices", {}), ("/jobs", {"limit": 50})):
        t = time.perf_counter()
        answer = client.get(path, params=params)
        entry = {"path": path, "ms": (time.perf_counter() - t) * 1000, "status": answer.status_code}
        if path == "/devices" and answer.status_code == 200:  # how late the heartbeats are
            entry["ages"] = [d["heartbeat_age"] for d in answer.json() if d["alive"]]
        out.write(json.dumps(entry) + "\n")
    for name, ask in asked.items():
        t = time.perf_counter()
        ask()
        out.write(json.dumps({"query": name, "ms": (time.perf_counter() - t) * 1000}) + "\n")


def _stop_on_term() -> Any:
    stopped: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    return lambda: bool(stopped)


def _sleep(stop: Any, seconds: float) -> None:
    """Sleep `seconds`, waking every 0.2 s to see whether SIGTERM came."""
    end = time.monotonic() + seconds
    while not stop() and (left := end - time.monotonic()) > 0:
        time.sleep(min(0.2, left))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet.roles", description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["reconciler", "poll"])
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--api", default="")
    ap.add_argument("--history", type=int, default=0)
    args = ap.parse_args(argv)
    if args.role == "reconciler":
        reconciler_role(args.log)
    else:
        poll_role(args.log, args.api, args.history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
