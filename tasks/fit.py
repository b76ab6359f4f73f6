"""The data-parallel training loop, written the way MXNet's multi-device guide writes it:
the net initialized on every context, each batch split with `split_and_load`, forward and
backward per device, one Trainer (kvstore `device` on GPUs, `local` on CPUs) summing gradients
and stepping by the global batch size."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from tasks.datasets import Dataset
from tasks.zoo import build
from workers.jobspecs import TrainParams


@dataclass
class EpochResult:
    epoch: int
    train_loss: float
    train_accuracy: float
    val_accuracy: float | None
    seconds: float
    samples_per_sec: float
    per_device: dict[str, float]


def make_net(p: TrainParams, classes: int, shape: tuple[int, ...],
             ctxs: list[mx.Context]) -> gluon.HybridBlock:
    """The same initial weights on every context for a given seed, whatever the device count."""
    net = build(p.arch, classes, shape)
    mx.random.seed(p.seed)
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if p.dtype == "float16":
        net.cast("float16")
    net.hybridize(static_alloc=True)
    return net


def make_trainer(p: TrainParams, net: gluon.HybridBlock, on_gpu: bool) -> gluon.Trainer:
    opts: dict[str, Any] = {"learning_rate": p.lr}
    if p.optimizer in ("sgd", "nag"):
        opts["momentum"] = 0.9
    if p.dtype == "float16":
        opts["multi_precision"] = True
    return gluon.Trainer(net.collect_params(), p.optimizer, opts,
                         kvstore="device" if on_gpu else "local")


def _accuracy(net: gluon.HybridBlock, data: Dataset, ctx: mx.Context, batch: int, dtype: str) -> float:
    hits = 0
    for i in range(0, len(data.y), batch):
        x = mx.nd.array(data.x[i:i + batch], ctx=ctx, dtype=dtype)
        hits += int((net(x).argmax(axis=1).asnumpy().astype(np.int32) == data.y[i:i + batch]).sum())
    return hits / len(data.y)


def run_epoch(net: gluon.HybridBlock, trainer: gluon.Trainer, data: Dataset, ctxs: list[mx.Context],
              p: TrainParams, epoch: int, on_batch: Callable[[float], None]) -> tuple[float, float, float]:
    """One pass in a seeded order; returns (mean loss, accuracy, seconds)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    order = np.random.default_rng(p.seed + epoch).permutation(len(data.y))
    # Loss and hits stay on the devices until the epoch ends: no host sync per batch.
    total_loss = [mx.nd.zeros(1, ctx=c) for c in ctxs]
    hits = [mx.nd.zeros(1, ctx=c) for c in ctxs]
    began = time.perf_counter()
    steps = range(0, len(order), p.batch_size)
    for n, i in enumerate(steps):
        idx = order[i:i + p.batch_size]
        xs = gluon.utils.split_and_load(mx.nd.array(data.x[idx], dtype=p.dtype), ctxs, even_split=False)
        ys = gluon.utils.split_and_load(mx.nd.array(data.y[idx]), ctxs, even_split=False)
        with autograd.record():
            outs = [net(x) for x in xs]
            losses = [loss_fn(o, y) for o, y in zip(outs, ys, strict=True)]
        for loss in losses:
            loss.backward()
        trainer.step(len(idx))
        for k, (o, y, loss) in enumerate(zip(outs, ys, losses, strict=True)):
            total_loss[k] += loss.sum().astype("float32")
            hits[k] += (o.argmax(axis=1) == y.astype(o.dtype)).sum().astype("float32")
        on_batch((n + 1) / len(steps))
    loss_sum = sum(float(t.asscalar()) for t in total_loss)
    hit_sum = sum(float(h.asscalar()) for h in hits)
    return loss_sum / len(order), hit_sum / len(order), time.perf_counter() - began


def fit(p: TrainParams, train: Dataset, val: Dataset | None, ctxs: list[mx.Context],
        labels: list[str], net: gluon.HybridBlock, trainer: gluon.Trainer, start_epoch: int = 1,
        on_batch: Callable[[int, float], None] = lambda e, f: None,
        on_epoch: Callable[[EpochResult], None] = lambda r: None) -> list[EpochResult]:
    """Epochs start_epoch..p.epochs; `labels` name the contexts' devices for per-device figures."""
    results = []
    share = np.array_split(np.arange(p.batch_size), len(ctxs))  # samples each device gets per step
    for epoch in range(start_epoch, p.epochs + 1):
        loss, acc, seconds = run_epoch(net, trainer, train, ctxs, p, epoch,
                                       lambda f, e=epoch: on_batch(e, f))
        n = len(train.y)
        val_acc = _accuracy(net, val, ctxs[0], p.batch_size, p.dtype) if val is not None else None
        result = EpochResult(epoch, loss, acc, val_acc, seconds, n / seconds, {
            label: n * len(s) / p.batch_size / seconds for label, s in zip(labels, share, strict=True)})
        on_epoch(result)
        results.append(result)
    return results
