"""Sharing: how soon an urgent job starts on devices saturated by low-priority work, with and
without preemption, and what a preemption costs.

Two CPU devices are saturated by `backlog` queued `low` inference jobs of about `job_seconds`
each (a LeNet over an input sized by measuring one job first). `tries` times, a `high` job of one
batch is submitted at a random moment and its submit-to-start time taken from SQL; first with
the backlog not preemptible (`--no-preemptible`: the high job waits for a running job to end),
then preemptible (the low default: a running job yields at its next flush).

The cost: a low job per engine (MXNet, ONNX Runtime) preempted mid-way and resumed, against an
uninterrupted run of the same job: its predictions compared sample by sample, the samples it
computed more than once (the sum of its throughput points over its samples).

Fair share: users with weights 1 and 3 submit `fair_jobs` small jobs each at once (and a user
with a quota of one device a tenth of that): each one's device-seconds while both have work
waiting, and the capped user's most devices at once.

    python -m bench.sharing [--tries 20] [--backlog 200] [--job-seconds 5]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

from bench.infer_overhead import MODEL, make_input, register, warm
from bench.stack import running_stack, wait_job
from mxq.json_types import JsonObject
from mxq.tasks.inference.infer import FLUSH_ROWS, FLUSH_SECONDS
from mxq.workers.settings import Settings

SHAPE = (1, 28, 28)
BATCH = 256


def _submit(s: Settings, path: Path, level: str, preemptible: bool | None = None,
            engine: str = "auto") -> int:
    from mxq.priorities import Priority
    from mxq.workers.jobs.submit import submit

    params: JsonObject = {"model": MODEL, "input": str(path), "batch_size": BATCH, "engine": engine}
    return submit(s, "infer", params, "auto", priority=Priority.of(level, preemptible))


def _backlog(s: Settings, path: Path, n: int, preemptible: bool) -> list[int]:
    from mxq.priorities import Priority
    from mxq.workers.jobs.submit import submit_many

    params: JsonObject = {"model": MODEL, "input": str(path), "batch_size": BATCH}
    return submit_many(s, "infer", [dict(params) for _ in range(n)], "auto",
                       priority=Priority.of("low", preemptible))


def _cancel_all(s: Settings, ids: list[int]) -> None:
    """End the backlog: the queued jobs at once, the running ones at their next batch."""
    from mxq.db import jobs

    for job_id in ids:
        jobs.cancel(s.database, job_id)
    for job_id in ids:
        while _status(s, job_id) not in ("succeeded", "failed", "cancelled"):
            time.sleep(0.2)


def _status(s: Settings, job_id: int) -> str:
    from mxq.db.reports.history import require_job

    return require_job(s.database, job_id)["status"]


def _start_delay(s: Settings, urgent: Path, rng: random.Random, job_seconds: float) -> float:
    """One try: a high job submitted at a random moment of the backlog's jobs; seconds from its
    submit to its start, as SQL recorded them."""
    from datetime import datetime

    time.sleep(rng.uniform(0, job_seconds))
    record = wait_job(s, _submit(s, urgent, "high"), poll=0.05)
    started, submitted = record["started_at"], record["submitted_at"]
    assert started is not None and submitted is not None
    return (datetime.fromisoformat(started) - datetime.fromisoformat(submitted)).total_seconds()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def urgent_start(s: Settings, backlog: Path, urgent: Path, n: int, tries: int, job_seconds: float,
                 preemptible: bool, seed: int) -> dict[str, Any]:
    ids = _backlog(s, backlog, n, preemptible)
    rng = random.Random(seed)
    while _status(s, ids[1]) == "queued":  # both devices busy
        time.sleep(0.1)
    delays = [_start_delay(s, urgent, rng, job_seconds) for _ in range(tries)]
    _cancel_all(s, ids)
    label = "preemption" if preemptible else "no preemption"
    print(f"  {label}: submit-to-start p50 {_p(delays, 0.5):.2f} s, p95 {_p(delays, 0.95):.2f} s "
          f"over {tries} tries", flush=True)
    return {"p50": _p(delays, 0.5), "p95": _p(delays, 0.95), "delays": delays}


def _predictions(s: Settings, job_id: int) -> list[tuple[int, int, float]]:
    from mxq.db.outputs import predictions

    return [(r["index"], r["predicted_class"], r["score"]) for r in predictions.read(s.database, job_id)]


def _computed(s: Settings, job_id: int) -> int:
    from mxq.db.reports.history import metrics

    return sum(int(m["samples"]) for m in metrics(s.database, job_id))


def _committed(s: Settings, job_id: int) -> int:
    from sqlalchemy import select

    from mxq.db.engine import session_scope
    from mxq.db.schema import Job

    with session_scope(s.database) as session:
        return session.scalar(select(Job.committed).where(Job.id == job_id)) or 0


def preemption_cost(s: Settings, probe: Path, urgent: Path, job_seconds: float,
                    engine: str) -> dict[str, Any]:
    """A low job on each device; a high one submitted once both stored a flush: the one that
    yielded, resumed, against an uninterrupted run of the same job. The job is sized by this
    engine's own rate, twice `job_seconds` (a cold first probe understates the rate): sized by
    MXNet's, ONNX Runtime's (faster) ended before its next flush."""
    samples = _samples_for(s, probe, 2 * job_seconds, engine)
    backlog = make_input(s.home_path / f"cost-{engine}.npy", samples, SHAPE, seed=4)
    pair = [_submit(s, backlog, "low", engine=engine) for _ in range(2)]
    while min(_committed(s, job_id) for job_id in pair) == 0:
        time.sleep(0.02)
    wait_job(s, _submit(s, urgent, "high", engine=engine))
    done = max((wait_job(s, job_id) for job_id in pair), key=lambda j: j["preemptions"])
    if not done["preemptions"]:
        raise RuntimeError("neither low job was preempted: they ended before their next flush "
                           "(raise --job-seconds)")
    low = done["id"]
    reference = _predictions(s, wait_job(s, _submit(s, backlog, "normal", engine=engine))["id"])
    stored = _predictions(s, low)
    scores = max((abs(a[2] - b[2]) for a, b in zip(stored, reference, strict=True)), default=0.0)
    flush = min(FLUSH_ROWS, float(done["samples_per_sec"] or 0) * FLUSH_SECONDS)
    result = {"engine": (done["result"] or {}).get("engine"), "preemptions": done["preemptions"],
              "flush_samples": flush,
              "stored": len(stored), "unique": len({i for i, _, _ in stored}), "samples": samples,
              "computed_twice": _computed(s, low) - samples,
              "classes_equal": [c for _, c, _ in stored] == [c for _, c, _ in reference],
              "max_score_diff": scores}
    print(f"  {engine}: {result['preemptions']} preemption(s), {result['stored']:,} rows of "
          f"{samples:,}, computed twice {result['computed_twice']}, classes equal "
          f"{result['classes_equal']}, max score diff {scores:.1e}", flush=True)
    return result


def _spans(s: Settings, ids: list[int]) -> list[tuple[str, float, float]]:
    """(owner, start, end) of each job, in seconds since the epoch, from SQL."""
    from sqlalchemy import select

    from mxq.db.engine import session_scope
    from mxq.db.schema import Job, as_utc

    with session_scope(s.database) as session:
        rows = session.scalars(select(Job).where(Job.id.in_(ids)))
        return [(str(j.owner), as_utc(j.started_at).timestamp(), as_utc(j.finished_at).timestamp())
                for j in rows if j.started_at is not None and j.finished_at is not None]


def _most_at_once(spans: list[tuple[str, float, float]]) -> int:
    edges = sorted([(a, 1) for _, a, _ in spans] + [(b, -1) for _, _, b in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def fair_share(s: Settings, path: Path, per_user: int) -> dict[str, Any]:
    """Users with weights 1 and 3 submit `per_user` jobs each at once, a third user with a quota
    of 1 device a tenth of that: device-seconds per user while both weighted users have work
    waiting, and the third one's most devices at once."""
    from mxq.db.sharing import users
    from mxq.shares import Share
    from mxq.users import Role
    from mxq.workers.jobs.submit import submit_many

    for name, weights in (("w1", Share(1.0)), ("w3", Share(3.0)), ("capped", Share(1.0, 1))):
        users.add(s.database, name, Role.SUBMIT, weights)
    params: JsonObject = {"model": MODEL, "input": str(path), "batch_size": BATCH, "output": "npy"}
    ids = {name: submit_many(s, "infer", [dict(params) for _ in range(n)], "auto", owner=name)
           for name, n in (("w1", per_user), ("w3", per_user), ("capped", max(4, per_user // 10)))}
    for job_ids in ids.values():
        for job_id in job_ids:
            wait_job(s, job_id, poll=0.2)
    spans = _spans(s, [i for v in ids.values() for i in v])
    begin = min(a for _, a, _ in spans)
    # contended while both weighted users have jobs waiting: until the first one's last start
    end = min(max(a for o, a, _ in spans if o == name) for name in ("w1", "w3"))
    used = {name: sum(max(0.0, min(b, end) - max(a, begin)) for o, a, b in spans if o == name)
            for name in ("w1", "w3")}
    share = used["w3"] / max(used["w1"] + used["w3"], 1e-9)
    most = _most_at_once([x for x in spans if x[0] == "capped"])
    print(f"  fair share: w3 (weight 3) had {share:.1%} of the weighted users' device-seconds over "
          f"{end - begin:.0f} s of contention (aim 75 %); the user with a 1-device quota held at "
          f"most {most} at once", flush=True)
    return {"per_user": per_user, "seconds": used, "w3_share": share, "contended_seconds": end - begin,
            "capped_most_devices": most, "capped_quota": 1}


def _samples_for(s: Settings, probe: Path, job_seconds: float, engine: str = "auto") -> int:
    """Samples (whole batches, at least 4) one job of `engine` computes in about `job_seconds`,
    from the samples/s of a probe job on one device."""
    job = wait_job(s, _submit(s, probe, "normal", engine=engine))
    rate = float(job["samples_per_sec"] or 1.0)
    return max(4 * BATCH, int(rate * job_seconds) // BATCH * BATCH)


def run(tries: int = 20, backlog: int = 200, job_seconds: float = 5.0, fair_jobs: int = 300,
        seed: int = 0, root: Path | None = None) -> dict[str, Any]:
    with running_stack(cpu_devices=2, root=root, prefix="sharing-") as s:
        register(s, "lenet", SHAPE)
        warm(s, SHAPE, BATCH, ["cpu:0", "cpu:1"])
        probe = make_input(s.home_path / "probe.npy", 20 * BATCH, SHAPE)
        samples = _samples_for(s, probe, job_seconds)
        path = make_input(s.home_path / "backlog.npy", samples, SHAPE)
        urgent = make_input(s.home_path / "urgent.npy", BATCH, SHAPE, seed=2)
        plain = urgent_start(s, path, urgent, backlog, tries, job_seconds, False, seed)
        preempting = urgent_start(s, path, urgent, backlog, tries, job_seconds, True, seed)
        cost = [preemption_cost(s, probe, urgent, job_seconds, e) for e in ("mxnet", "onnx")]
        small = make_input(s.home_path / "small.npy", 4 * BATCH, SHAPE, seed=3)
        fair = fair_share(s, small, fair_jobs)
    return {"tries": tries, "backlog": backlog, "job_seconds": job_seconds, "samples": samples,
            "no_preemption": plain, "preemption": preempting, "cost": cost, "fair": fair,
            "ratio": preempting["p95"] / max(plain["p95"], 1e-9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--backlog", type=int, default=200)
    ap.add_argument("--job-seconds", type=float, default=5.0)
    ap.add_argument("--fair-jobs", type=int, default=300, help="jobs each weighted user submits")
    args = ap.parse_args()
    run(args.tries, args.backlog, args.job_seconds, args.fair_jobs)


if __name__ == "__main__":
    main()
