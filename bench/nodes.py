"""One bulk-inference job split into chunks (`--chunk-size`) on 1 node, then on 2, same run.

Each node is an `mxq worker` launcher with one CPU device pinned to a core of its own, its own
MXQ_HOME, the same broker and database (as separate hosts would share them). The 1-node figure
is measured first, then the second node joins and the same job runs again; the chunks spread
over both nodes through the pool queue. Prints samples/s of each (the parent job's: its samples
over the span from the first chunk's start to the last one's end), the ratio, and where the
chunks ran.

    python -m bench.nodes [--samples 100000] [--chunks 8] [--arch lenet] [--shape 1,28,28]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.stack import ROOT, rate, wait_job
from mxq.db.fleet import alive_since
from mxq.db.migrate import upgrade
from mxq.db.reports.history import JobFilter, list_jobs
from mxq.db.schema import utcnow
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.settings import Settings

if TYPE_CHECKING:
    from mxq.db.records import JobRecord


def start_node(home: Path, settings: Settings, node: str, core: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
    env.update(MXQ_HOME=str(home / node), MXQ_NODE=node, MXQ_CPU_DEVICES="1",
               MXQ_BROKER_URL=settings.broker, MXQ_DATABASE_URL=settings.database,
               MXQ_DATA_ROOT=str(home), MXQ_NVIDIA_SMI=str(home / "none"))
    (home / node).mkdir()
    cores = sorted(os.sched_getaffinity(0))
    pin = {cores[core % len(cores)]}
    since = utcnow()
    proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: os.sched_setaffinity(0, pin))
    name = f"cpu0@{node}"
    while alive_since(settings.database, [name], since, settings.heartbeat_ttl) != {name}:
        if proc.poll() is not None:
            raise RuntimeError(f"the launcher of {node} exited; see {home / node / 'logs'}")
        time.sleep(0.2)
    return proc


def run(settings: Settings, params: dict[str, Any]) -> tuple[JobRecord, float, Counter[str | None]]:
    started = time.perf_counter()
    job = wait_job(settings, _submit(settings, params))
    wall = time.perf_counter() - started
    chunks = [j for j in list_jobs(settings.database, JobFilter(kind="infer", limit=10000))
              if j["parent_id"] == job["id"]]
    return job, wall, Counter(c["node"] for c in chunks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--arch", default="lenet")
    ap.add_argument("--shape", default="1,28,28")
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    with tempfile.TemporaryDirectory(prefix="mxq-bench-nodes-") as tmp:
        home = Path(tmp)
        redis = EmbeddedRedis(home)
        redis.start()
        settings = Settings(home=home, node="bench", cpu_devices=1, data_root=home,
                            nvidia_smi=str(home / "none"))
        settings = settings.model_copy(update={"broker_url": settings.broker,
                                               "database_url": settings.database})
        upgrade(settings.database)
        nodes: list[subprocess.Popen] = []
        try:
            from mxq.tasks.model_store.mxnet.versions import add_builtin

            add_builtin(settings, "bench", args.arch, shape, 10)
            path = home / "input.npy"
            rng = np.random.default_rng(0)
            np.save(path, rng.normal(size=(args.samples, *shape)).astype(np.float32))
            params = {"model": "bench", "input": str(path), "batch_size": args.batch_size,
                      "chunk_size": -(-args.samples // args.chunks)}
            np.save(home / "warm.npy", np.load(path, mmap_mode="r")[:8 * args.batch_size])
            warm_params = {**params, "input": str(home / "warm.npy"), "chunk_size": 2 * args.batch_size}

            nodes.append(start_node(home, settings, "node1", 0))
            wait_job(settings, _submit(settings, warm_params))  # model cache warm
            one, wall1, where1 = run(settings, params)

            nodes.append(start_node(home, settings, "node2", 1))
            for _ in range(2):  # both workers load the model once before the measured run
                wait_job(settings, _submit(settings, warm_params))
            two, wall2, where2 = run(settings, params)
        finally:
            for proc in nodes:
                proc.terminate()
            for proc in nodes:
                proc.wait(timeout=60)
            redis.stop()
    print(f"model {args.arch} {shape}, {args.samples:,} samples in {args.chunks} chunks, "
          f"batch {args.batch_size}; one CPU device (one core) per node")
    print(f"1 node   {rate(one):12,.0f} samples/s  (submit..done {args.samples / wall1:,.0f}/s)"
          f"  chunks: {dict(where1)}")
    print(f"2 nodes  {rate(two):12,.0f} samples/s  (submit..done {args.samples / wall2:,.0f}/s)"
          f"  chunks: {dict(where2)}")
    print(f"ratio 2 nodes / 1 node: {rate(two) / rate(one):.3f} "
          f"(submit..done: {wall1 / wall2:.3f})")


def _submit(settings: Settings, params: dict) -> int:
    from mxq.workers.jobs.submit import submit

    return submit(settings, "infer", params, "auto")


if __name__ == "__main__":
    main()
