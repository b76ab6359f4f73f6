"""`mxq infer` (one device, end to end, results stored) against a bare MXNet loop, same run.

Same registered model, same .npy input, same batch size, same cores and threads (the bare loop
runs in a process pinned like the worker); three alternating runs of each, medians. Prints the
throughput ratio, and the worker's peak memory on the input and on one 10x larger (streaming
keeps it flat). Then an embedding model over the same input, `--output npy`, against its own
bare loop (`bench.embedding`).

    python -m bench.infer_overhead [--samples 200000] [--arch lenet] [--shape 1,28,28]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench import embedding
from bench.report.markdown import figures
from bench.stack import peak_rss_mib, rate, run_pinned, running_stack, wait_job, worker_cores, worker_pids
from mxq.json_types import JsonObject
from mxq.workers.settings import Settings

if TYPE_CHECKING:
    from mxq.db.records import ModelRecord

MODEL = "bench"


def bare_loop(model: ModelRecord, path: str, batch: int) -> float:
    """Samples/s of the plain loop a user would write: read a batch, forward, softmax, to numpy."""
    from mxq.tasks.model_store.models import load
    from mxq.tasks.runtimes.mx import mx
    from mxq.workers.settings import get_settings

    net, _ = load(get_settings(), model, mx.cpu(0))
    data = np.load(path, mmap_mode="r")
    net(mx.nd.array(data[:batch])).wait_to_read()  # warm-up, as the worker's first batch
    start = time.perf_counter()
    for i in range(0, len(data), batch):
        mx.nd.softmax(net(mx.nd.array(data[i:i + batch]))).asnumpy()
    return len(data) / (time.perf_counter() - start)


def pinned_bare(s: Settings, path: Path, batch: int, cores: list[int]) -> float:
    """The bare loop in a process with the cores and threads of the worker it is compared with."""
    out = run_pinned(["-m", "bench.infer_overhead", "--bare", s.database, "--input", str(path),
                      "--batch-size", str(batch)], cores)
    return float(out.strip().splitlines()[-1])


def register(s: Settings, arch: str, shape: tuple[int, ...], classes: int = 10) -> ModelRecord:
    from mxq.tasks.model_store.mxnet.versions import add_builtin

    return add_builtin(s, MODEL, arch, shape, classes)


def make_input(path: Path, samples: int, shape: tuple[int, ...], seed: int = 0) -> Path:
    """`samples` random samples as float32 .npy, written in slices (never all in memory)."""
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(samples, *shape))
    step = 50_000
    for i in range(0, samples, step):
        out[i:i + step] = rng.normal(size=(min(step, samples - i), *shape)).astype(np.float32)
    out.flush()
    del out
    return path


def warm(s: Settings, shape: tuple[int, ...], batch: int, devices: list[str]) -> None:
    """One small job per device, so the timed jobs find the model loaded (as the bare loop's
    warm-up batch)."""
    from mxq.workers.jobs.submit import submit

    path = make_input(s.home_path / "warm.npy", batch, shape, seed=1)
    for device in devices:
        wait_job(s, submit(s, "infer", {"model": MODEL, "input": str(path), "batch_size": batch},
                           device))


def inference(s: Settings, samples: int, shape: tuple[int, ...], batch: int,
              rounds: int = 3) -> dict[str, Any]:
    """mxq infer on cpu:0 against the bare loop on cpu:0's cores: `rounds` alternating runs of
    each, medians (one run of either swings by several percent on a shared machine)."""
    from mxq.workers.jobs.submit import submit

    path = make_input(s.home_path / "input.npy", samples, shape)
    warm(s, shape, batch, ["cpu:0"])
    cores = worker_cores(s, "cpu:0")
    bare, mxq, end_to_end = [], [], []
    for _ in range(rounds):
        bare.append(pinned_bare(s, path, batch, cores))
        t0 = time.perf_counter()
        job = wait_job(s, submit(s, "infer", {"model": MODEL, "input": str(path),
                                              "batch_size": batch}, "cpu:0"))
        end_to_end.append(samples / (time.perf_counter() - t0))
        mxq.append(rate(job))
    baseline = statistics.median(bare)
    return {"samples": samples, "batch_size": batch, "cores": cores, "bare": baseline,
            "bare_runs": bare, "mxq_runs": mxq, "mxq": statistics.median(mxq),
            "mxq_end_to_end": statistics.median(end_to_end),
            "ratio": statistics.median(mxq) / baseline,
            "ratio_end_to_end": statistics.median(end_to_end) / baseline}


def memory(s: Settings, samples: int, shape: tuple[int, ...], batch: int) -> dict[str, Any]:
    """The worker's peak RSS after a job on `samples`, then after one on 10x as many."""
    from mxq.workers.jobs.submit import submit

    path = make_input(s.home_path / "input.npy", samples, shape)
    params: JsonObject = {"model": MODEL, "batch_size": batch}
    wait_job(s, submit(s, "infer", {**params, "input": str(path)}, "cpu:0"))
    pid = worker_pids(s)["cpu:0"]
    small = peak_rss_mib(pid)
    big = s.home_path / "input10x.npy"
    out = np.lib.format.open_memmap(big, mode="w+", dtype=np.float32, shape=(10 * samples, *shape))
    for i in range(10):
        out[i * samples:(i + 1) * samples] = np.load(path, mmap_mode="r")
    out.flush()
    del out
    path.unlink()  # only the 10x input needs the disk now
    wait_job(s, submit(s, "infer", {**params, "input": str(big)}, "cpu:0"))
    large = peak_rss_mib(pid)
    return {"samples": samples, "samples_10x": 10 * samples,
            "input_mib": samples * int(np.prod(shape)) * 4 / 2**20,
            "peak_rss_1x_mib": small, "peak_rss_10x_mib": large, "ratio": large / small}


def run_inference(samples: int = 200_000, arch: str = "lenet", shape: tuple[int, ...] = (1, 28, 28),
                  batch: int = 256, root: Path | None = None) -> dict[str, Any]:
    with running_stack(cpu_devices=1, root=root, prefix="inference-") as s:
        register(s, arch, shape)
        result = inference(s, samples, shape, batch)
        embedding.register(s, shape)
        result["embedding"] = embedding.measure(s, s.home_path / "input.npy", batch, result["cores"])
    result.update(arch=arch, shape=list(shape))
    print(f"  model {arch} {shape}, {samples:,} samples, batch {batch}, cores {result['cores']}")
    print(f"  bare MXNet loop          {result['bare']:12,.0f} samples/s  (median of runs: "
          f"{figures(result['bare_runs'])})")
    print(f"  mxq infer (job)          {result['mxq']:12,.0f} samples/s  ratio {result['ratio']:.3f}  "
          f"(median of runs: {figures(result['mxq_runs'])})")
    print(f"  mxq infer (submit..done) {result['mxq_end_to_end']:12,.0f} samples/s  "
          f"ratio {result['ratio_end_to_end']:.3f}")
    _print_embedding(result["embedding"])
    return result


def _print_embedding(e: dict[str, Any]) -> None:
    print(f"  embedding ({e['width']}-d), --output {e['output']}, engine {e['engine']}: bare loop "
          f"{e['bare']:,.0f}, mxq infer (job) {e['mxq']:,.0f} samples/s  ratio {e['ratio']:.3f}  "
          f"(max |diff| {e['max_abs_diff']:.1e})")


def run_memory(samples: int = 50_000, arch: str = "lenet", shape: tuple[int, ...] = (1, 28, 28),
               batch: int = 256, root: Path | None = None) -> dict[str, Any]:
    with running_stack(cpu_devices=1, root=root, prefix="memory-") as s:
        register(s, arch, shape)
        result = memory(s, samples, shape, batch)
    result.update(arch=arch, shape=list(shape))
    print(f"  worker peak RSS: {result['peak_rss_1x_mib']:,.0f} MiB after {samples:,} samples "
          f"({result['input_mib']:,.0f} MiB input), {result['peak_rss_10x_mib']:,.0f} MiB after "
          f"{10 * samples:,}; ratio {result['ratio']:.3f}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--arch", default="lenet")
    ap.add_argument("--shape", default="1,28,28")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                    help="also run a 10x input and compare the worker's peak memory")
    ap.add_argument("--bare", metavar="DATABASE", help=argparse.SUPPRESS)  # internal: baseline only
    ap.add_argument("--input", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare:
        from mxq.db.registry import resolve

        print(bare_loop(resolve(args.bare, MODEL), args.input, args.batch_size))
        return
    shape = tuple(int(d) for d in args.shape.split(","))
    run_inference(args.samples, args.arch, shape, args.batch_size)
    if args.memory:
        run_memory(args.samples, args.arch, shape, args.batch_size)


if __name__ == "__main__":
    main()
