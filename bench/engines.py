"""Inference engines: bare MXNet, bare ONNX Runtime and `mxq infer --engine auto`, same run.

For each model: one registered version (exported to ONNX at registration) and one `.npy` input.
The built-in MLP has random weights and random inputs; LeNet (1x28x28) is trained by `mxq train`
on the digits (scaled up to 28x28) and ResNet-18 (3x64x64) briefly on generated images (ten
smooth class patterns under noise), and each is run over its own data, tiled. Both bare loops
run in a process pinned like the worker (its cores and thread limits): read a batch, run the
engine, probabilities to NumPy. Then `mxq infer --engine auto` on cpu:0: its first job measures
both engines and stores the choice; the figure is a job after it, which reads it and stores
its probabilities in the job's `.npy` (`--output npy`). The bare loops and that job run in
alternation, ROUNDS turns each, and each figure is its best turn (the host's noise falls on all
of them alike). A third job stores every prediction as
SQL rows instead, for information: with a fast engine and a small model, the rows' writes bound
it. Aim: `auto` at least 0.9 of the faster bare engine, with predictions equal to MXNet's (every
argmax, probabilities within 1e-4).

Precision: each version also gets its int8 and fp16 variants (the trained ones by the training's
`--calibration` on its own labeled dataset, the MLP's from 4,096 samples of its input; each
checked on a held-out quarter), run bare on ONNX Runtime and by `mxq infer --precision auto
--min-agreement 0.99`; the ratio is that job against the best bare loop the bound allows (a
variant counts only when its agreement meets 0.99). The report gives each model's FLOPs per
sample (its convolutions and matrix products, from the ONNX graph) and the GFLOP/s achieved
beside the device's peak for the precision it ran in (cores x clock x operations per cycle from
the CPU's vector flags; int8 against the int8 peak).
Jobs last as users' bulk jobs do (issue 61): each model gets an input for JOB_SECONDS of its
fastest bare loop at scale 1 (the float32 ONNX Runtime loop and the variants the version already
has, timed first on 64 batches each), run by the variants' bare loops and the precision job, and
its first part (the same samples in a file of their own), JOB_SECONDS of the float32 loop, run
by the float32 loops and jobs; each at most MEMORY_SHARE of the memory available, which the
MLP's, at more than a million samples/s, reaches (its jobs last 10 to 15 s).

    python -m bench.engines [--scale 1.0] [--epochs 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.infer_overhead import bare_loop, make_input
from bench.report.checks import against_peak
from bench.report.markdown import meminfo_bytes
from bench.stack import rate, run_pinned, running_stack, wait_job, worker_cores
from mxq.engines import VARIANTS
from mxq.json_types import JsonObject
from mxq.workers.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from mxq.db.records import JobRecord, ModelRecord

# (architecture, input shape, batch size)
MODELS = [("mlp", (256,), 512), ("lenet", (1, 28, 28), 256), ("resnet18_v1", (3, 64, 64), 64)]
JOB_SECONDS = 60.0  # a bare loop over its input lasts this long at scale 1 ...
MEMORY_SHARE = 0.6  # ... unless the input would hold more than this share of the memory available
AGREEMENT_ROWS = 1_000_000  # the stored predictions are checked against MXNet's this many at a time
TRAINED_ON = {"lenet": "digits", "resnet18_v1": "generated"}  # the others keep random weights
BOUND = 0.99  # --min-agreement of the precision jobs
CALIBRATION_SAMPLES = 4096
GENERATED = 1_000  # generated images ResNet-18 is trained on
ROUNDS = 2  # turns of each bare loop and job, alternated (`alternated`): each figure its best
# (a neighbour's load on this shared host falls on a turn, rarely on both: with second-long jobs
# two turns left the MLP at 0.77 of its bare loop in one run, three at 0.92; minute-long jobs
# average such moments within a turn)


def _dataset(arch: str, shape: tuple[int, ...], generated: int = GENERATED) -> tuple[np.ndarray, np.ndarray]:
    """What `arch` trains on, as float32 in [0, 1]-ish and labels: the digits scaled up (each
    pixel a 3x3 block, centred in 28x28), or ten smooth random patterns under noise."""
    if TRAINED_ON[arch] == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x = np.kron(d.images.astype(np.float32) / 16, np.ones((3, 3), np.float32))
        pad = (shape[-1] - x.shape[-1]) // 2
        x = np.pad(x, ((0, 0), (pad, shape[-1] - x.shape[-1] - pad), (pad, shape[-1] - x.shape[-1] - pad)))
        return x[:, None].astype(np.float32), d.target.astype(np.int32)
    rng = np.random.default_rng(0)
    cells = shape[-1] // 8
    patterns = np.kron(rng.normal(size=(10, shape[0], 8, 8)), np.ones((cells, cells))).astype(np.float32)
    y = rng.integers(0, 10, generated).astype(np.int32)
    return patterns[y] + rng.normal(scale=0.8, size=(generated, *shape)).astype(np.float32), y


def _tiled(path: Path, x: np.ndarray, samples: int) -> Path:
    """An input of `samples` rows: `x` repeated, written in slices."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(samples, *x.shape[1:]))
    for i in range(0, samples, len(x)):
        out[i:i + len(x)] = x[:samples - i]
    out.flush()
    del out
    return path


def _trained(s: Settings, arch: str, shape: tuple[int, ...], epochs: int, generated: int = GENERATED
             ) -> tuple[np.ndarray, dict[str, Any]]:
    """`mxq train` of `arch` on its dataset, building both variants from that (labeled) dataset;
    the dataset's samples (the inference input tiles them) and the training's figures."""
    from mxq.workers.jobs.submit import submit

    x, y = _dataset(arch, shape, generated)
    data = s.home_path / f"{arch}-train.npz"
    np.savez(data, X=x, y=y)
    job = wait_job(s, submit(s, "train", {"arch": arch, "dataset": str(data), "name": arch,
                                          "epochs": epochs, "batch_size": 32, "lr": 0.05,
                                          "calibration": str(data), "variants": list(VARIANTS)},
                             "cpu:0"))
    result = job["result"] or {}
    failed = [v for v in result.get("variants", []) if "error" in v]
    assert not failed, failed
    return x, {"trained_on": TRAINED_ON[arch], "train_samples": len(x), "epochs": epochs,
               "val_accuracy": result.get("val_accuracy")}


def _sized(s: Settings, model: ModelRecord, shape: tuple[int, ...], batch: int, cores: list[int],
           scale: float) -> tuple[int, int]:
    """Samples for JOB_SECONDS x `scale` of the bare float32 ONNX Runtime loop, and of the
    fastest bare loop (float32 or a variant the version has), each timed on 64 batches (pinned
    like the others), within `input_budget`: as in users' bulk jobs, fixed costs (a job's start,
    loading the model, the variant's check) and a neighbour's moment of load on a shared host
    must not weigh on the figures."""
    arch = model["name"]
    probe = make_input(s.home_path / f"{arch}-probe.npy", batch * 64, shape)
    rates = {e: _pinned(s, e, arch, probe, batch, cores) for e in ("onnx", *model["variants"])}
    probe.unlink()
    most = input_budget() // (4 * int(np.prod(shape)))

    def sized(samples_per_sec: float) -> int:
        return max(256, batch * 4, int(min(samples_per_sec * JOB_SECONDS, most) * scale))

    return sized(rates["onnx"]), sized(max(rates.values()))


def input_budget() -> int:
    """The most bytes an input may hold: MEMORY_SHARE of the memory available now, so that it
    stays in the page cache and every loop over it measures compute, not the disk (the MLP, at
    more than a million samples a second, needs 13 GiB for 10 s: its input is capped here)."""
    available = meminfo_bytes("MemAvailable")
    return 1 << 30 if available is None else int(available * MEMORY_SHARE)  # off Linux: 1 GiB


def flops_per_sample(onnx_file: str, input_shape: tuple[int, ...]) -> float:
    """Multiply-adds (x2) of one sample's convolutions and matrix products in the ONNX graph,
    from shapes inferred at batch 1; elementwise operations are not counted."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = onnx.load(onnx_file)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, size in zip(dims, (1, *input_shape), strict=True):
        dim.ClearField("dim_param")
        dim.dim_value = size
    graph = shape_inference.infer_shapes(model).graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*graph.value_info, *graph.output]}
    weights = {w.name: numpy_helper.to_array(w).shape for w in graph.initializer}
    total = 0.0
    for node in graph.node:
        if node.op_type == "Conv" and node.input[1] in weights and node.output[0] in shapes:
            kernel = weights[node.input[1]]  # (out, in / groups, kh, kw)
            total += 2.0 * float(np.prod(shapes[node.output[0]][1:])) * float(np.prod(kernel[1:]))
        elif node.op_type in ("Gemm", "MatMul") and node.input[1] in weights:
            total += 2.0 * float(np.prod(weights[node.input[1]]))
    return total


def peak_gflops(cores: int) -> dict[str, Any]:
    """The float32 and int8 peaks of `cores` of this CPU: clock (its maximum frequency, else the
    current one) x operations per cycle of its widest vector unit. float32: two FMA pipes, so
    AVX-512 64 FLOP/cycle (32 on AMD's Zen 4, family 25, which runs 512-bit FMAs as two halves),
    AVX2+FMA 32, AVX 16, SSE 8. int8 multiply-adds: 4x that with VNNI (vpdpbusd: four 8-bit
    products per 32-bit lane), else 2x (vpmaddubsw)."""
    flags: set[str] = set()
    mhz, family, vendor = 0.0, 0, ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "cpu MHz" and not mhz:
            mhz = float(value)
        elif key == "cpu family" and not family:
            family = int(value)
        elif key == "vendor_id" and not vendor:
            vendor = value
    top = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if top.is_file():
        mhz = int(top.read_text()) / 1000
    halves = vendor == "AuthenticAMD" and family == 25
    per_cycle = ((32 if halves else 64) if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else
                 16 if "avx" in flags else 8)
    vnni = "avx512_vnni" in flags or "avx_vnni" in flags
    gflops = cores * mhz / 1000 * per_cycle
    return {"gflops": gflops, "int8_gops": gflops * (4 if vnni else 2), "cores": cores,
            "ghz": mhz / 1000, "flops_per_cycle": per_cycle, "vnni": vnni}


def bare_onnx(model: ModelRecord, path: str, batch: int, precision: str = "onnx") -> float:
    """Samples/s of the same loop on ONNX Runtime, with the session mxq builds (its threads), on
    the export or on its `precision` variant."""
    from mxq.tasks.runtimes import onnx_runtime

    assert model["onnx"] is not None, f"{model['name']} has no ONNX export"
    built = model["onnx"] if precision == "onnx" else model["variants"][precision]
    sess, _ = onnx_runtime.session(Path(built["file"]))
    data = np.load(path, mmap_mode="r")
    onnx_runtime.run(sess, data[:batch])  # warm-up, as the worker's first batch
    start = time.perf_counter()
    for i in range(0, len(data), batch):
        onnx_runtime.run(sess, data[i:i + batch])
    return len(data) / (time.perf_counter() - start)


def _pinned(s: Settings, engine: str, name: str, path: Path, batch: int, cores: list[int]) -> float:
    out = run_pinned(["-m", "bench.engines", "--bare", engine, "--database", s.database, "--model", name,
                      "--input", str(path), "--batch-size", str(batch)], cores)
    return float(out.strip().splitlines()[-1])


def alternated(measures: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each measure's best of `rounds` turns, taken in alternation: on a shared host a
    neighbour's load moved one loop's figure by a fifth between runs, and a ratio of two
    figures timed minutes apart inherited it."""
    best = dict.fromkeys(measures, 0.0)
    for _ in range(rounds):
        for name, measure in measures.items():
            best[name] = max(best[name], measure())
    return best


def _with_job(s: Settings, bare: Mapping[str, Callable[[], float]], params: dict[str, Any],
              rounds: int) -> tuple[dict[str, float], JobRecord]:
    """The `bare` loops' figures and the fastest of the `params` jobs on cpu:0, all run
    `alternated`."""
    from mxq.workers.jobs.submit import submit

    jobs: list[JobRecord] = []

    def job() -> float:
        jobs.append(wait_job(s, submit(s, "infer", params, "cpu:0")))
        return rate(jobs[-1])

    figures = alternated({**bare, "job": job}, rounds)
    del figures["job"]
    return figures, max(jobs, key=rate)


def fixed_costs(job: JobRecord) -> dict[str, float | None]:
    """What the job's start and end cost (its result's `fixed_costs`, seconds)."""
    return dict((job["result"] or {})["fixed_costs"])


def from_claim(job: JobRecord) -> float:
    """The job's samples/s with its start counted: its rate covers its batches and last flush
    only, from when its engine was ready."""
    costs = fixed_costs(job)
    start = sum(costs[k] or 0.0 for k in ("model_load", "engine_measure", "variant_check"))
    samples = job["samples"] or 0
    return samples / (samples / rate(job) + start)


def _agreement(s: Settings, job_id: int, model: ModelRecord, path: Path) -> dict[str, float]:
    """The stored predictions against MXNet's own on the same input, AGREEMENT_ROWS at a time
    (the MLP's input holds millions of samples)."""
    from mxq.db.outputs import predictions
    from mxq.tasks.model_store.models import load, probabilities
    from mxq.tasks.runtimes.mx import mx

    net, _ = load(s, model, mx.cpu())
    data = np.load(path, mmap_mode="r")
    agreed, diff = 0, 0.0
    for first in range(0, len(data), AGREEMENT_ROWS):
        part = data[first:first + AGREEMENT_ROWS]
        theirs = np.concatenate([probabilities(net, mx.cpu(), part[i:i + 256])
                                 for i in range(0, len(part), 256)])
        rows = predictions.read(s.database, job_id, len(part), first)
        classes = np.array([r["predicted_class"] for r in rows])
        scores = np.array([r["score"] for r in rows])
        agreed += int((classes == theirs.argmax(axis=1)).sum())
        diff = max(diff, float(np.abs(scores - theirs.max(axis=1)).max()))
    return {"argmax_agreement": agreed / len(data), "max_score_diff": diff}


def one_model(s: Settings, arch: str, shape: tuple[int, ...], batch: int, scale: float,
              epochs: int, rounds: int, generated: int = GENERATED) -> dict[str, Any]:
    from mxq.db.registry import resolve
    from mxq.tasks.model_store.mxnet.versions import add_builtin
    from mxq.workers.jobs.submit import submit

    training: dict[str, Any] = {"trained_on": None}
    x: np.ndarray | None = None
    if arch in TRAINED_ON:
        x, training = _trained(s, arch, shape, epochs, generated)
        model = resolve(s.database, arch)
    else:
        model = add_builtin(s, arch, arch, shape, 10)
    cores = worker_cores(s, "cpu:0")
    samples, precision_samples = _sized(s, model, shape, batch, cores, scale)
    inputs = {n: (make_input(s.home_path / f"{arch}-{n}.npy", n, shape) if x is None else
                  _tiled(s.home_path / f"{arch}-{n}.npy", x, n)) for n in {samples, precision_samples}}
    path = inputs[samples]
    params: JsonObject = {"model": arch, "input": str(path), "batch_size": batch, "engine": "auto"}
    first = wait_job(s, submit(s, "infer", {**params, "output": "npy"}, "cpu:0"))  # measures, stores
    loops = {e: partial(_pinned, s, e, arch, path, batch, cores) for e in ("mxnet", "onnx")}
    bare, job = _with_job(s, loops, {**params, "output": "npy"}, rounds)
    rows = wait_job(s, submit(s, "infer", params, "cpu:0"))
    faster = max(bare, key=lambda k: bare[k])
    result = job["result"] or {}
    fp32 = {"arch": arch, "shape": list(shape), "batch_size": batch, "samples": samples,
            "cores": cores, "bare": bare, "faster_bare": faster, "mxq_auto": rate(job),
            "mxq_auto_sql": rate(rows), "first_job": rate(first),
            "fixed_costs": {"first_job": fixed_costs(first), "fp32_job": fixed_costs(job),
                            "sql_job": fixed_costs(rows)},
            "engine": result["engine"], "engine_reason": result["engine_reason"],
            "onnx": model["onnx"], "ratio_fp32": rate(job) / bare[faster],
            "flops_per_sample": flops_per_sample((model["onnx"] or {})["file"], shape),
            **_agreement(s, rows["id"], model, path), **training}
    precision = _precision(s, arch, inputs[precision_samples], batch, cores, fp32, rounds)
    for made in inputs.values():  # the next model's inputs take the page cache
        made.unlink()
    return {**fp32, "precision_samples": precision_samples, **precision}


def _variants(s: Settings, arch: str, path: Path) -> ModelRecord:
    """The version with both variants: as its training built them, else built here from the
    first CALIBRATION_SAMPLES of the input (unlabeled)."""
    from mxq.db.registry import resolve
    from mxq.tasks.model_store.variants import build_variant, calibration_from

    model = resolve(s.database, arch)
    if arch not in TRAINED_ON:
        sample = np.asarray(np.load(path, mmap_mode="r")[:CALIBRATION_SAMPLES])
        for precision in VARIANTS:
            model = build_variant(s, model, precision, calibration_from(sample, None, str(path), model))
    return model


def _precision(s: Settings, arch: str, path: Path, batch: int, cores: list[int],
               fp32: dict[str, Any], rounds: int) -> dict[str, Any]:
    """The variants: built, run bare, and `--precision auto` within BOUND; the ratio of that job
    to the best bare loop the bound allows."""
    from mxq.workers.jobs.submit import submit

    variants = _variants(s, arch, path)["variants"]
    params: JsonObject = {"model": arch, "input": str(path), "batch_size": batch, "engine": "auto",
              "output": "npy", "precision": "auto", "min_agreement": BOUND}
    wait_job(s, submit(s, "infer", params, "cpu:0"))  # measures the variants that could serve
    loops = {v: partial(_pinned, s, v, arch, path, batch, cores) for v in VARIANTS}
    measured, job = _with_job(s, loops, params, rounds)
    bare = {**fp32["bare"], **measured}
    allowed = {k: v for k, v in bare.items() if k not in VARIANTS or variants[k]["agreement"] >= BOUND}
    best = max(allowed, key=lambda k: allowed[k])
    result = job["result"] or {}
    checks = {v: {k: variants[v][k] for k in ("agreement", "max_diff", "held_out", "accuracy")}
              for v in VARIANTS}
    return {"bare": bare, **checks, "best_bare": best, "mxq_precision": rate(job),
            "precision": result["precision"], "precision_reason": result["precision_reason"],
            "ratio": rate(job) / bare[best], "precision_fixed_costs": fixed_costs(job),
            "mxq_precision_from_claim": from_claim(job)}


def run(scale: float = 1.0, epochs: int = 3, rounds: int = ROUNDS, root: Path | None = None,
        generated: int = GENERATED) -> dict[str, Any]:
    results = []
    with running_stack(cpu_devices=1, root=root, prefix="engines-") as s:
        peak = peak_gflops(len(worker_cores(s, "cpu:0")))
        for arch, shape, batch in MODELS:
            r = one_model(s, arch, shape, batch, scale, epochs, rounds, generated)
            r["gflops"] = r["mxq_precision"] * r["flops_per_sample"] / 1e9
            results.append(r)
            print(f"  {arch:12} {str(tuple(shape)):14} batch {batch:4}: bare MXNet "
                  f"{r['bare']['mxnet']:10,.0f}  ONNX Runtime {r['bare']['onnx']:10,.0f}  int8 "
                  f"{r['bare']['int8']:10,.0f}  fp16 {r['bare']['fp16']:10,.0f}  "
                  f"mxq auto ({r['engine']}) {r['mxq_auto']:10,.0f}  "
                  f"mxq --precision auto ({r['precision']}) {r['mxq_precision']:10,.0f} samples/s  "
                  f"ratio {r['ratio']:.3f}; agreement int8 {r['int8']['agreement']:.2%}, fp16 "
                  f"{r['fp16']['agreement']:.2%}; "
                  f"{r['flops_per_sample'] / 1e6:,.2f} MFLOP/sample, {against_peak(r, peak)}")
    worst = min(results, key=lambda r: r["ratio"])
    return {"models": results, "ratio": worst["ratio"], "worst": worst["arch"], "peak": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="input sizes as a share of the full ones")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of the trained models")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="alternated turns of each loop and job")
    ap.add_argument("--bare", choices=["mxnet", "onnx", *VARIANTS], help=argparse.SUPPRESS)  # a baseline
    ap.add_argument("--database", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare:
        from mxq.db.registry import resolve

        model = resolve(args.database, args.model)
        if args.bare == "mxnet":
            print(bare_loop(model, args.input, args.batch_size))
        else:
            print(bare_onnx(model, args.input, args.batch_size, args.bare))
        return
    run(args.scale, args.epochs, args.rounds)


if __name__ == "__main__":
    main()
