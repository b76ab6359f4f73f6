"""The inference case from a bucket: the same `mxq infer` job over the same `.npy` input, from a
local file and from an S3-compatible server on loopback (moto's), same run, alternating.

Prints the throughput ratio (S3 over local) and the worker's peak memory after the local jobs
and after the S3 ones: ranged reads with a bounded read-ahead should cost no memory.

    python -m bench.object_storage [--samples 200000]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from bench.infer_overhead import MODEL, make_input, register, warm
from bench.s3server import BUCKET, S3Server
from bench.stack import peak_rss_mib, rate, running_stack, wait_job, worker_pids


def _timed(s: Any, source: str, batch: int) -> float:
    from mxq.workers.jobs.submit import submit

    return rate(wait_job(s, submit(s, "infer", {"model": MODEL, "input": source, "batch_size": batch},
                                   "cpu:0")))


def run(samples: int = 200_000, arch: str = "lenet", shape: tuple[int, ...] = (1, 28, 28),
        batch: int = 256, rounds: int = 3, root: Path | None = None) -> dict[str, Any]:
    server = S3Server.start()
    try:
        with running_stack(cpu_devices=1, root=root, prefix="objects-", env=server.env()) as s:
            register(s, arch, shape)
            path = make_input(s.home_path / "input.npy", samples, shape)
            server.client().upload_file(str(path), BUCKET, "in/input.npy")
            url = f"s3://{BUCKET}/in/input.npy"
            warm(s, shape, batch, ["cpu:0"])
            pid = worker_pids(s)["cpu:0"]
            local, remote = [_timed(s, str(path), batch)], []
            peak_local = peak_rss_mib(pid)  # before any object was read
            remote.append(_timed(s, url, batch))
            for _ in range(rounds - 1):
                local.append(_timed(s, str(path), batch))
                remote.append(_timed(s, url, batch))
            peak_remote = peak_rss_mib(pid)
    finally:
        server.stop()
    result = {"samples": samples, "arch": arch, "shape": list(shape), "batch_size": batch,
              "input_mib": path_mib(samples, shape), "local_runs": local, "s3_runs": remote,
              "local": statistics.median(local), "s3": statistics.median(remote),
              "ratio": statistics.median(remote) / statistics.median(local),
              "peak_rss_local_mib": peak_local, "peak_rss_s3_mib": peak_remote,
              "memory_ratio": peak_remote / peak_local}
    print(f"  {arch} {tuple(shape)}, {samples:,} samples ({result['input_mib']:,.0f} MiB), batch {batch}")
    print(f"  local .npy  {result['local']:12,.0f} samples/s")
    print(f"  s3:// .npy  {result['s3']:12,.0f} samples/s  ratio {result['ratio']:.3f}")
    print(f"  worker peak RSS {peak_local:,.0f} MiB after the local job, {peak_remote:,.0f} MiB "
          f"after the S3 ones; ratio {result['memory_ratio']:.3f}")
    return result


def path_mib(samples: int, shape: tuple[int, ...]) -> float:
    n = samples * 4
    for d in shape:
        n *= d
    return n / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    run(ap.parse_args().samples)


if __name__ == "__main__":
    main()
