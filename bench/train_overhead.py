"""`mxq train` against the bare data-parallel loop of MXNet's multi-device guide, same run:
same data, architecture, global batch, epochs and devices (1 and 2). Prints the ratios. Two
architectures: the built-in LeNet, and a user's own CNN (none of mxq's), which mxq trains from
its registered, exported graph (`mxq train --from`) and from its registered code (`mxq arch add`),
and the bare loop from the same Gluon code.

Each side's figure is the median of its epochs' samples/s (the bare loop runs before and after
the job): an epoch of this size lasts about a second, and the median keeps one disturbed
epoch on a shared machine from deciding the ratio.

    python -m bench.train_overhead [--copies 10] [--epochs 5] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.stack import rate, run_pinned, running_stack, wait_job

# A user's own CNN for the digits (none of mxq's built-ins), as a user writes it in Gluon: the
# file `mxq arch add` registers, and the net the bare loop and the registered export are built from.
USER_CNN = """
from mxnet import gluon


def build(classes, input_shape):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.MaxPool2D(2), gluon.nn.Flatten(), gluon.nn.Dropout(0.2), gluon.nn.Dense(classes))
    return net
"""


def user_cnn() -> Any:
    """The user's CNN, built by its own factory (the file's code, run here as a user's script)."""
    namespace: dict[str, Any] = {}
    exec(compile(USER_CNN, "usercnn.py", "exec"), namespace)  # our own constant, not input
    return namespace["build"](10, (1, 8, 8))


def bare_loop(x: np.ndarray, y: np.ndarray, k: int, epochs: int, batch: int,
              arch: str = "lenet") -> list[float]:
    """The guide's loop: split_and_load, record, backward per device, one Trainer step."""
    from mxq.tasks.model_store.zoo import build
    from mxq.tasks.runtimes.mx import autograd, gluon, mx

    ctxs = [mx.cpu(i) for i in range(k)]
    net = build("lenet", 10, x.shape[1:]) if arch == "lenet" else user_cnn()
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    net.hybridize(static_alloc=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            kvstore="local")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rates = []
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(len(y))
        start = time.perf_counter()
        for i in range(0, len(y), batch):
            idx = order[i:i + batch]
            xs = gluon.utils.split_and_load(mx.nd.array(x[idx]), ctxs, even_split=False)
            ys = gluon.utils.split_and_load(mx.nd.array(y[idx]), ctxs, even_split=False)
            with autograd.record():
                losses = [loss_fn(net(a), b) for a, b in zip(xs, ys, strict=True)]
            for loss in losses:
                loss.backward()
            trainer.step(len(idx))
        mx.nd.waitall()
        rates.append(len(y) / (time.perf_counter() - start))
    return rates


def pinned_bare(copies: int, epochs: int, batch: int, k: int, arch: str) -> list[float]:
    """The bare loop's epochs (samples/s) in a process with the cores and threads mxq gives a
    k-device job."""
    from mxq.workers.hardware.pinning import cpu_cores

    cores = sorted({c for i in range(k) for c in cpu_cores(i, 2)})
    out = run_pinned(["-m", "bench.train_overhead", "--bare", str(k), "--copies", str(copies),
                      "--epochs", str(epochs), "--batch-size", str(batch), "--arch", arch], cores)
    return json.loads(out.strip().splitlines()[-1])


def data(copies: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.tile((d.images / 16.0).astype(np.float32)[:, None], (copies, 1, 1, 1))
    return x, np.tile(d.target, copies).astype(np.float32)


def register_user_cnn(s: Any, shape: tuple[int, ...]) -> str:
    """The user's CNN, exported by Gluon and registered as `mxq models add --symbol/--params`
    does; what `mxq train --from` then trains."""
    from mxq.tasks.model_store.mxnet.versions import add_exported
    from mxq.tasks.runtimes.mx import mx

    net = user_cnn()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, *shape)))
    net.export(str(s.home_path / "usercnn"))
    add_exported(s, "usercnn", s.home_path / "usercnn-symbol.json",
                 s.home_path / "usercnn-0000.params", shape)
    return "usercnn"


def register_user_code(s: Any, shape: tuple[int, ...]) -> str:
    """The user's CNN file registered as `mxq arch add usercode usercnn.py --factory build`
    does (its trial runs as a job on a worker); what `mxq train usercode` then trains."""
    from mxq.users import local_owner
    from mxq.workers.jobs.archs import queue_trial

    wait_job(s, queue_trial(s, "usercode", USER_CNN.encode(), "usercnn.py", "build", 10, list(shape),
                            local_owner()))
    return "usercode"


def _compare(s: Any, arch: str, k: int, params: dict[str, Any], copies: int, epochs: int,
             batch: int, samples: int) -> dict[str, Any]:
    """One architecture on k devices: the bare loop before and after the job, the job."""
    from mxq.db.outputs.epochs import list_epochs
    from mxq.workers.jobs.submit import submit

    bare_epochs = pinned_bare(copies, epochs, batch, k, arch)
    t0 = time.perf_counter()
    job = wait_job(s, submit(s, "train", {**params, "devices": k, "epochs": epochs,
                                          "batch_size": batch, "val_fraction": 0.0}, "auto"))
    wall = time.perf_counter() - t0
    bare_epochs += pinned_bare(copies, epochs, batch, k, arch)
    mxq_epochs = [e["samples_per_sec"] for e in list_epochs(s.database, job["id"])]
    bare, mxq = statistics.median(bare_epochs), statistics.median(mxq_epochs)
    row = {"bare": bare, "mxq": mxq, "ratio": mxq / bare, "bare_epochs": bare_epochs,
           "mxq_epochs": mxq_epochs, "mxq_job": rate(job), "ratio_job": rate(job) / bare,
           "mxq_end_to_end": samples * epochs / wall,
           "ratio_end_to_end": samples * epochs / wall / bare}
    print(f"  {arch}, {k} device(s), median epoch: bare {bare:10,.0f} samples/s | mxq train "
          f"{mxq:10,.0f} samples/s, ratio {row['ratio']:.3f} | whole job {row['mxq_job']:10,.0f}"
          f", ratio {row['ratio_job']:.3f} | end to end (submit..done, with start-up) "
          f"{row['mxq_end_to_end']:10,.0f}, ratio {row['ratio_end_to_end']:.3f}")
    return row


def run(copies: int = 10, epochs: int = 5, batch: int = 128, root: Path | None = None,
        devices: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    """mxq train against the bare loop on each number of devices, for LeNet (`devices`) and the
    user's CNN from its export (`user`) and from its code (`user_code`); samples/s and ratios."""
    x, y = data(copies)
    result: dict[str, Any] = {"samples": len(y), "copies": copies, "epochs": epochs,
                              "batch_size": batch, "devices": {}, "user": {}, "user_code": {}}
    print(f"  lenet and a user's CNN on digits x{copies} ({len(y):,} samples), {epochs} epochs, "
          f"global batch {batch}")
    with running_stack(cpu_devices=2, root=root, prefix="training-") as s:
        np.savez(s.home_path / "train.npz", X=x, y=y.astype(np.int64))
        dataset = str(s.home_path / "train.npz")
        for k in devices:
            result["devices"][str(k)] = _compare(s, "lenet", k, {"arch": "lenet", "dataset": dataset,
                                                 "name": f"b{k}"}, copies, epochs, batch, len(y))
        source = register_user_cnn(s, x.shape[1:])
        code = register_user_code(s, x.shape[1:])
        for k in devices:
            result["user"][str(k)] = _compare(s, "user", k, {
                "from_model": source, "reinit": True, "dataset": dataset, "name": f"u{k}"},
                copies, epochs, batch, len(y))
            result["user_code"][str(k)] = _compare(s, "user", k, {
                "arch": code, "dataset": dataset, "name": f"c{k}"}, copies, epochs, batch, len(y))
    result["ratio"] = min(r["ratio"] for case in ("devices", "user", "user_code")
                          for r in result[case].values())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=10, help="digits repeated this often")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--bare", type=int, help=argparse.SUPPRESS)  # internal: run the baseline only
    ap.add_argument("--arch", default="lenet", help=argparse.SUPPRESS)  # the baseline's: lenet or user
    args = ap.parse_args()
    if args.bare:
        x, y = data(args.copies)
        print(json.dumps(bare_loop(x, y, args.bare, args.epochs, args.batch_size, args.arch)))
        return
    run(args.copies, args.epochs, args.batch_size)


if __name__ == "__main__":
    main()
