"""Inference engines: bare MXNet, bare ONNX Runtime and `mxq infer --engine auto`, same run.

For each model (the built-in MLP, LeNet and ResNet-18, random weights): one registered version
(exported to ONNX at registration) and one `.npy` input. Both bare loops run in a process pinned
like the worker (its cores and thread limits): read a batch, run the engine, probabilities to
NumPy. Then `mxq infer --engine auto` on cpu:0: its first job measures both engines and stores
the choice; the figure is the job after it, which reads it and stores its probabilities in the
job's `.npy` (`--output npy`). A third job stores every prediction as SQL rows instead, for
information: with a fast engine and a small model, the rows' writes bound it. Aim: `auto` at
least 0.9 of the faster bare engine, with predictions equal to MXNet's (every argmax,
probabilities within 1e-4).

    python -m bench.engines [--scale 1.0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.infer_overhead import bare_loop, make_input
from bench.stack import rate, run_pinned, running_stack, wait_job, worker_cores
from mxq.workers.settings import Settings

if TYPE_CHECKING:
    from mxq.db.records import ModelRecord

# (architecture, input shape, batch size, samples at scale 1)
MODELS = [("mlp", (256,), 512, 200_000), ("lenet", (1, 28, 28), 256, 30_000),
          ("resnet18_v1", (3, 64, 64), 64, 1_500)]


def bare_onnx(model: ModelRecord, path: str, batch: int) -> float:
    """Samples/s of the same loop on ONNX Runtime, with the session mxq builds (its threads)."""
    from mxq.tasks.runtimes import onnx_runtime

    assert model["onnx"] is not None, f"{model['name']} has no ONNX export"
    sess, _ = onnx_runtime.session(Path(model["onnx"]["file"]))
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


def _agreement(s: Settings, job_id: int, model: ModelRecord, path: Path) -> dict[str, float]:
    """The stored predictions against MXNet's own on the same input."""
    from mxq.db.outputs import predictions
    from mxq.tasks.model_store.models import load, probabilities
    from mxq.tasks.runtimes.mx import mx

    net, _ = load(model, mx.cpu())
    data = np.load(path, mmap_mode="r")
    theirs = np.concatenate([probabilities(net, mx.cpu(), data[i:i + 256])
                             for i in range(0, len(data), 256)])
    rows = predictions.read(s.database, job_id)
    classes = np.array([r["predicted_class"] for r in rows])
    scores = np.array([r["score"] for r in rows])
    return {"argmax_agreement": float((classes == theirs.argmax(axis=1)).mean()),
            "max_score_diff": float(np.abs(scores - theirs.max(axis=1)).max())}


def one_model(s: Settings, arch: str, shape: tuple[int, ...], batch: int, samples: int) -> dict[str, Any]:
    from mxq.tasks.model_store.models import add_builtin
    from mxq.workers.jobs.submit import submit

    model = add_builtin(s.database, s.home_path, arch, arch, shape, 10)
    path = make_input(s.home_path / f"{arch}.npy", samples, shape)
    cores = worker_cores(s, "cpu:0")
    bare = {"mxnet": _pinned(s, "mxnet", arch, path, batch, cores),
            "onnx": _pinned(s, "onnx", arch, path, batch, cores)}
    params = {"model": arch, "input": str(path), "batch_size": batch, "engine": "auto"}
    first = wait_job(s, submit(s, "infer", {**params, "output": "npy"}, "cpu:0"))  # measures, stores
    job = wait_job(s, submit(s, "infer", {**params, "output": "npy"}, "cpu:0"))
    rows = wait_job(s, submit(s, "infer", params, "cpu:0"))
    faster = max(bare, key=lambda k: bare[k])
    result = job["result"] or {}
    return {"arch": arch, "shape": list(shape), "batch_size": batch, "samples": samples,
            "cores": cores, "bare": bare, "faster_bare": faster, "mxq_auto": rate(job),
            "mxq_auto_sql": rate(rows), "first_job": rate(first),
            "engine": result["engine"], "engine_reason": result["engine_reason"],
            "onnx": model["onnx"], "ratio": rate(job) / bare[faster],
            **_agreement(s, rows["id"], model, path)}


def run(scale: float = 1.0, root: Path | None = None) -> dict[str, Any]:
    results = []
    with running_stack(cpu_devices=1, root=root, prefix="engines-") as s:
        for arch, shape, batch, samples in MODELS:
            r = one_model(s, arch, shape, batch, max(batch * 4, int(samples * scale)))
            results.append(r)
            print(f"  {arch:12} {str(tuple(shape)):14} batch {batch:4}: bare MXNet "
                  f"{r['bare']['mxnet']:10,.0f}  bare ONNX Runtime {r['bare']['onnx']:10,.0f}  "
                  f"mxq auto ({r['engine']}) {r['mxq_auto']:10,.0f} samples/s  ratio {r['ratio']:.3f} "
                  f"(SQL rows: {r['mxq_auto_sql']:,.0f}); "
                  f"argmax agreement {r['argmax_agreement']:.2%}, max score diff {r['max_score_diff']:.1e}")
    worst = min(results, key=lambda r: r["ratio"])
    return {"models": results, "ratio": worst["ratio"], "worst": worst["arch"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="input sizes as a share of the full ones")
    ap.add_argument("--bare", choices=["mxnet", "onnx"], help=argparse.SUPPRESS)  # internal: a baseline
    ap.add_argument("--database", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare:
        from mxq.db.registry import resolve

        model = resolve(args.database, args.model)
        loop = bare_loop if args.bare == "mxnet" else bare_onnx
        print(loop(model, args.input, args.batch_size))
        return
    run(args.scale)


if __name__ == "__main__":
    main()
