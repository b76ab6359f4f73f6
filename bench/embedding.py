"""The inference case's embedding model (issue 48): `mxq infer --output npy` of a model that is
not a classifier, against the bare loop on the engine the job ran, same run.

The model is a small Gluon CNN without its classifier layer (two convolutions, a 128-d dense
layer; seeded Xavier weights, nothing downloaded), exported and registered with
`add_exported(..., outputs="embedding")` as `mxq models add --outputs embedding` does. It reads
the case's own input (the LeNet's (1, 28, 28) `.npy`), so both models see the same samples.

Fairness: an embedding job's product is its (N, 128) float32 array in `job-ID.npy`, and SQL rows
are refused for it, so the bare loop keeps its array too: forward each batch, to NumPy into one
preallocated (N, 128) array, and `np.save` it at the end, timed with it. A loop that wrote nothing
would charge mxq for a write no user of an embedding can skip. The bare loop runs the engine the
job ran (the first job, `--engine auto`, measures both and stores its choice; the timed jobs read
it): plain MXNet forward, or ONNX Runtime on the version's export with mxq's session. The job's
stored values must equal the bare loop's within MAX_DIFF (asserted, and recorded), so the
figure is of the same work.

    python -m bench.embedding --bare ENGINE --database URL --input X.npy --batch-size B --out Y.npy
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.stack import rate, run_pinned, wait_job
from mxq.workers.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from numpy.typing import NDArray

    from mxq.db.records import JobRecord, ModelRecord

    Forward = Callable[[NDArray[np.float32]], NDArray[np.float32]]

MODEL = "bench-embedding"
WIDTH = 128
MAX_DIFF = 1e-5  # the job's values against the bare loop's, per element
CHUNK = 50_000  # rows compared at a time (the full input's arrays are 100 MB each)


def register(s: Settings, shape: tuple[int, ...], seed: int = 0) -> ModelRecord:
    """The CNN, seeded, exported beside the stack's home and registered as an embedding."""
    from mxq.tasks.model_store.mxnet.versions import add_exported
    from mxq.tasks.runtimes.mx import mx

    nn = mx.gluon.nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 3, padding=1, activation="relu"), nn.MaxPool2D(2),
            nn.Conv2D(32, 3, padding=1, activation="relu"), nn.MaxPool2D(2),
            nn.Flatten(), nn.Dense(WIDTH))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, *shape)))
    prefix = s.home_path / "embedder"
    net.export(str(prefix))
    return add_exported(s, MODEL, Path(f"{prefix}-symbol.json"), Path(f"{prefix}-0000.params"),
                        shape, outputs="embedding")


def _forward(model: ModelRecord, engine: str) -> Forward:
    """One batch's (batch, WIDTH) values as NumPy, on `engine`, loaded as a worker loads it."""
    if engine == "onnx":
        from mxq.tasks.runtimes import onnx_runtime

        assert model["onnx"] is not None, f"{model['name']} has no ONNX export"
        sess, _ = onnx_runtime.session(Path(model["onnx"]["file"]))
        return onnx_runtime.runner(sess)
    from mxq.tasks.model_store.models import load
    from mxq.tasks.runtimes.mx import mx
    from mxq.workers.settings import get_settings

    net, _ = load(get_settings(), model, mx.cpu(0))

    def forward(x: NDArray[np.float32]) -> NDArray[np.float32]:
        out: NDArray[np.float32] = net(mx.nd.array(x)).asnumpy()
        return out

    return forward


def bare_loop(model: ModelRecord, engine: str, path: str, batch: int, out: Path) -> float:
    """Samples/s of the loop a user would write to keep the embeddings: forward, to NumPy into
    one array, saved as `.npy` at the end (the save timed too)."""
    forward = _forward(model, engine)
    data = np.load(path, mmap_mode="r")
    forward(data[:batch])  # warm-up, as the worker's first batch
    start = time.perf_counter()
    values = np.empty((len(data), WIDTH), np.float32)
    for i in range(0, len(data), batch):
        values[i:i + batch] = forward(data[i:i + batch])
    np.save(out, values)
    return len(data) / (time.perf_counter() - start)


def pinned_bare(s: Settings, engine: str, path: Path, batch: int, cores: list[int]) -> float:
    """The bare loop in a process with the cores and threads of the worker it is compared with;
    its array lands in the home's embedding-bare.npy."""
    out = run_pinned(["-m", "bench.embedding", "--bare", engine, "--database", s.database,
                      "--input", str(path), "--batch-size", str(batch),
                      "--out", str(s.home_path / "embedding-bare.npy")], cores)
    return float(out.strip().splitlines()[-1])


def max_diff(ours: Path, theirs: Path) -> float:
    """The largest absolute difference between two (N, WIDTH) arrays, CHUNK rows at a time."""
    a, b = np.load(ours, mmap_mode="r"), np.load(theirs, mmap_mode="r")
    assert a.shape == b.shape, (a.shape, b.shape)
    return max((float(np.abs(a[i:i + CHUNK] - b[i:i + CHUNK]).max()) for i in range(0, len(a), CHUNK)),
               default=0.0)


def _job(s: Settings, path: Path, batch: int) -> JobRecord:
    from mxq.workers.jobs.submit import submit

    return wait_job(s, submit(s, "infer", {"model": MODEL, "input": str(path), "batch_size": batch,
                                           "output": "npy", "engine": "auto"}, "cpu:0"))


def measure(s: Settings, path: Path, batch: int, cores: list[int], rounds: int = 3) -> dict[str, Any]:
    """A first job (measures the engines, stores the choice), then `rounds` alternating runs of
    the bare loop on the engine it chose and of the job, medians; the last job's values checked
    against the last bare loop's."""
    engine = (_job(s, path, batch)["result"] or {})["engine"]
    bare, jobs = [], []
    for _ in range(rounds):
        bare.append(pinned_bare(s, engine, path, batch, cores))
        jobs.append(_job(s, path, batch))
    result = jobs[-1]["result"] or {}
    assert all((j["result"] or {})["engine"] == engine for j in jobs), [j["result"] for j in jobs]
    assert jobs[-1]["output"] is not None, jobs[-1]
    diff = max_diff(Path(jobs[-1]["output"]), s.home_path / "embedding-bare.npy")
    assert diff <= MAX_DIFF, f"the job's embeddings differ from the bare loop's by {diff:.3g}"
    mxq = statistics.median(rate(j) for j in jobs)
    return {"model": MODEL, "width": WIDTH, "output": "npy", "engine": engine,
            "engine_reason": result["engine_reason"], "bare": statistics.median(bare),
            "bare_runs": bare, "mxq_runs": [rate(j) for j in jobs], "mxq": mxq,
            "ratio": mxq / statistics.median(bare), "max_abs_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bare", choices=["mxnet", "onnx"], required=True)
    ap.add_argument("--database", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from mxq.db.registry import resolve

    print(bare_loop(resolve(args.database, MODEL), args.bare, args.input, args.batch_size, args.out))


if __name__ == "__main__":
    main()
