"""Device scaling: one inference job split in two chunks on 2 CPU devices against the same job
on 1 device, same run, same stack (each CPU device worker is pinned to its own share of the
cores, with that many MXNet/OpenMP threads: on a 2-core machine, one core each).

The input is sized to the machine (`--per-core` samples per core) and `--chunk-size` is half of
it, so the two chunks spread over both devices; on one device the same two chunks run in turn.

    python -m bench.scaling [--per-core 60000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.infer_overhead import MODEL, make_input, register, warm
from bench.stack import children, running_stack, wait_job, worker_cores
from mxq.json_types import JsonObject
from mxq.workers.settings import Settings


def one_run(s: Settings, path: Path, samples: int, batch: int, devices: int) -> dict[str, Any]:
    from mxq.workers.jobs.submit import submit

    params: JsonObject = {"model": MODEL, "input": str(path), "batch_size": batch, "chunk_size": samples // 2}
    t0 = time.perf_counter()
    job = wait_job(s, submit(s, "infer", params, "cpu:0" if devices == 1 else "auto"))
    wall = time.perf_counter() - t0
    used = sorted({c["device"] for c in children(s, job["id"])})
    return {"devices": devices, "samples_per_sec": job["samples_per_sec"],
            "end_to_end": samples / wall, "devices_used": used}


def run(per_core: int = 60_000, rounds: int = 2, arch: str = "lenet",
        shape: tuple[int, ...] = (1, 28, 28), batch: int = 256,
        root: Path | None = None) -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0))
    samples = per_core * cores // 2 * 2  # even, so the two chunks are equal
    with running_stack(cpu_devices=2, root=root, prefix="scaling-") as s:
        register(s, arch, shape)
        pinned = {d: worker_cores(s, d) for d in ("cpu:0", "cpu:1")}
        path = make_input(s.home_path / "input.npy", samples, shape)
        warm(s, shape, batch, ["cpu:0", "cpu:1"])
        runs: list[dict[str, Any]] = []
        for r in range(rounds):  # 1, 2 then 2, 1: drift of the machine's load evens out
            for k in ((1, 2) if r % 2 == 0 else (2, 1)):
                runs.append(one_run(s, path, samples, batch, k))
                print(f"  {k} device(s): {runs[-1]['samples_per_sec']:10,.0f} samples/s "
                      f"(chunks on {', '.join(runs[-1]['devices_used'])})", flush=True)
    one = statistics.mean(r["samples_per_sec"] for r in runs if r["devices"] == 1)
    two = statistics.mean(r["samples_per_sec"] for r in runs if r["devices"] == 2)
    both = all(len(r["devices_used"]) == 2 for r in runs if r["devices"] == 2)
    result = {"samples": samples, "chunk_size": samples // 2, "batch_size": batch, "arch": arch,
              "machine_cores": cores, "worker_cores": pinned, "runs": runs, "one_device": one,
              "two_devices": two, "ratio": two / one, "spread_over_both": both}
    print(f"  {samples:,} samples in chunks of {samples // 2:,}; cores cpu:0 {pinned['cpu:0']}, "
          f"cpu:1 {pinned['cpu:1']}")
    print(f"  1 device {one:,.0f} samples/s, 2 devices {two:,.0f} samples/s: {two / one:.2f}x "
          f"(ideal 2x){'' if both else '; WARNING: the chunks did not run on both devices'}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-core", type=int, default=60_000, help="input samples per core")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    run(args.per_core, args.rounds, batch=args.batch_size)


if __name__ == "__main__":
    main()
