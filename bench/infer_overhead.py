"""`mxq infer` (one device, end to end, results stored) against a bare MXNet loop, same run.

Same registered model, same .npy input, same batch size. Prints the throughput ratio, and the
worker's peak memory on the input and on one 10x larger (streaming keeps it flat).

    python -m bench.infer_overhead [--samples 200000] [--arch lenet] [--shape 1,28,28]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bench.stack import peak_rss_mib, running_stack, wait_job, worker_pids


def bare_loop(model: dict, path: str, batch: int) -> float:
    """Samples/s of the plain loop a user would write: read a batch, forward, softmax, to numpy."""
    import mxnet as mx

    from tasks.models import load

    net, _ = load(model, mx.cpu(0))
    data = np.load(path, mmap_mode="r")
    net(mx.nd.array(data[:batch])).wait_to_read()  # warm-up, as the worker's first batch
    start = time.perf_counter()
    for i in range(0, len(data), batch):
        mx.nd.softmax(net(mx.nd.array(data[i:i + batch]))).asnumpy()
    return len(data) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--arch", default="lenet")
    ap.add_argument("--shape", default="1,28,28")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                    help="also run a 10x input and compare the worker's peak memory")
    args = ap.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    with running_stack(cpu_devices=1) as s:
        # The bench process gets the worker's thread limits, so the baseline is like for like.
        from workers.launcher import cpu_cores
        os.environ["OMP_NUM_THREADS"] = str(len(cpu_cores(0, 1)))
        from tasks.models import add_builtin
        from workers.submit import submit

        model = add_builtin(s.database, s.home_path, "bench", args.arch, shape, 10)
        rng = np.random.default_rng(0)
        path = s.home_path / "input.npy"
        np.save(path, rng.normal(size=(args.samples, *shape)).astype(np.float32))
        params = {"model": "bench", "input": str(path), "batch_size": args.batch_size}
        wait_job(s, submit(s, "infer", {**params, "input": str(path)}, "cpu:0"))  # warm model cache
        bare = bare_loop(model, str(path), args.batch_size)
        t0 = time.perf_counter()
        job = wait_job(s, submit(s, "infer", params, "cpu:0"))
        wall = time.perf_counter() - t0
        bare_again = bare_loop(model, str(path), args.batch_size)
        baseline = (bare + bare_again) / 2
        print(f"model {args.arch} {shape}, {args.samples:,} samples, batch {args.batch_size}")
        print(f"bare MXNet loop      {baseline:12,.0f} samples/s  (runs: {bare:,.0f}, {bare_again:,.0f})")
        print(f"mxq infer (job)      {job['samples_per_sec']:12,.0f} samples/s  "
              f"ratio {job['samples_per_sec'] / baseline:.3f}")
        print(f"mxq infer (submit..done) {args.samples / wall:8,.0f} samples/s  "
              f"ratio {args.samples / wall / baseline:.3f}")
        if args.memory:
            pid = worker_pids(s)["cpu:0"]
            small = peak_rss_mib(pid)
            big = s.home_path / "input10x.npy"
            out = np.lib.format.open_memmap(big, mode="w+", dtype=np.float32,
                                            shape=(10 * args.samples, *shape))
            for i in range(10):
                out[i * args.samples:(i + 1) * args.samples] = np.load(path, mmap_mode="r")
            out.flush()
            del out
            wait_job(s, submit(s, "infer", {**params, "input": str(big)}, "cpu:0"))
            print(f"worker peak RSS: {small:,.0f} MiB after 1x, {peak_rss_mib(pid):,.0f} MiB after 10x "
                  f"({10 * args.samples:,} samples); ratio {peak_rss_mib(pid) / small:.3f}")


if __name__ == "__main__":
    main()
