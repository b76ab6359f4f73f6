"""Dynamic batching on against off: single-sample inference jobs per second, same run.

Two stacks in turn, each with its own home: workers started with MXQ_DYNAMIC_BATCHING=1, then
with 0 (every other setting at its default, two CPU devices). Each gets the same N jobs, one
sample of its own .npy input each, queued with one `submit_many`; jobs/s is N over the time
from the submit to the last job's finish.

    python -m bench.dynamic_batching [--jobs 1000]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench.infer_overhead import MODEL, register, warm
from bench.stack import running_stack, wait_jobs
from mxq.db.schema import utcnow
from mxq.json_types import JsonObject


def one_mode(on: bool, jobs: int, arch: str, shape: tuple[int, ...],
             root: Path | None) -> dict[str, Any]:
    from mxq.workers.jobs.submit import submit_many

    env = {"MXQ_DYNAMIC_BATCHING": "1" if on else "0"}
    with running_stack(cpu_devices=2, root=root, env=env,
                       prefix=f"batching-{'on' if on else 'off'}-") as s:
        register(s, arch, shape)
        warm(s, shape, 1, ["cpu:0", "cpu:1"])
        folder = s.home_path / "inputs"
        folder.mkdir()
        rng = np.random.default_rng(0)
        params: list[JsonObject] = []
        for i in range(jobs):
            path = folder / f"{i}.npy"
            np.save(path, rng.normal(size=(1, *shape)).astype(np.float32))
            params.append({"model": MODEL, "input": str(path), "batch_size": 1})
        t0 = utcnow()
        ids = submit_many(s, "infer", params, "auto")
        rows = wait_jobs(s, ids, poll=0.2)
    seconds = (max(r["finished_at"] for r in rows) - t0).total_seconds()
    batches = [r["result"].get("batched_jobs", 1) for r in rows if r["result"].get("batch_lead") in
               (None, r["id"])]
    return {"dynamic_batching": on, "jobs": jobs, "seconds": seconds, "jobs_per_sec": jobs / seconds,
            "batches": len(batches), "mean_jobs_per_batch": statistics.mean(batches) if batches else 1,
            "devices": sorted({r["device"] for r in rows})}


def run(jobs: int = 1000, arch: str = "lenet", shape: tuple[int, ...] = (1, 28, 28),
        root: Path | None = None) -> dict[str, Any]:
    modes = {}
    for on in (True, False):
        modes["on" if on else "off"] = m = one_mode(on, jobs, arch, shape, root)
        print(f"  dynamic batching {'on ' if on else 'off'}: {m['jobs_per_sec']:8,.1f} jobs/s "
              f"({jobs} jobs in {m['seconds']:.1f}s; {m['batches']} batches, "
              f"{m['mean_jobs_per_batch']:.1f} jobs each, on {', '.join(m['devices'])})", flush=True)
    result = {"jobs": jobs, "arch": arch, **modes,
              "ratio": modes["on"]["jobs_per_sec"] / modes["off"]["jobs_per_sec"]}
    print(f"  ratio on/off {result['ratio']:.2f}x")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    args = ap.parse_args()
    run(args.jobs)


if __name__ == "__main__":
    main()
