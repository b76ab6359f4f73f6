"""The data-parallel training loop, written the way MXNet's multi-device guide writes it:
the net initialized on every context, each batch split with `split_and_load`, forward and
backward per device, one Trainer (kvstore `device` on GPUs, `local` on CPUs) summing gradients
and stepping by the global batch size."""

from __future__ import annotations

import collections
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mxq.db.records import EpochResult
from mxq.tasks.model_store.zoo import build
from mxq.tasks.runtimes.mx import autograd, gluon, mx
from mxq.tasks.training.datasets import Dataset
from mxq.workers.jobs.jobspecs import TrainParams


def make_net(p: TrainParams, classes: int, shape: tuple[int, ...], ctxs: list[mx.Context],
             block: gluon.HybridBlock | None = None) -> gluon.HybridBlock:
    """The same initial weights on every context for a given seed, whatever the device count:
    a built-in architecture's net, or `block` (a registered architecture's, built by its code)."""
    # (a training --from has its own net: source_net)
    net = build(p.arch or "", classes, shape) if block is None else block
    mx.random.seed(p.seed)
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if p.dtype == "float16":
        net.cast("float16")
    net.hybridize(static_alloc=True)
    return net


def source_net(net: gluon.SymbolBlock, p: TrainParams) -> gluon.SymbolBlock:
    """A registered version's graph as the training's net: its weights (fine-tuning), or fresh
    ones for the same seed with `reinit`."""
    if p.reinit:
        reinitialize(net, p.seed)
    net.hybridize(static_alloc=True)
    return net


# Parameters a re-initialization sets by the role their name ends in (MXNet's own initializers
# name these roles; a BatchNorm's running statistics start at 0 and 1).
RUNNING_MEAN, RUNNING_VAR = ("running_mean", "moving_mean"), ("running_var", "moving_var")
LEARNED = ("weight", "bias", "gamma", "beta")


def reinitialize(net: gluon.Block, seed: int) -> None:
    """Fresh weights as a built-in architecture starts from (Xavier for weights, biases 0,
    BatchNorm's scale 1); a parameter of no known role keeps its stored value."""
    mx.random.seed(seed)
    xavier = mx.init.Xavier()
    for name, param in sorted(net.collect_params().items()):
        shape = param.data(param.list_ctx()[0]).shape  # (a SymbolBlock's `param.shape` may be unset)
        fresh = mx.nd.zeros(shape, dtype="float32")
        if name.endswith(RUNNING_VAR):
            fresh[:] = 1
        elif name.endswith(LEARNED) and (len(shape) >= 2 or not name.endswith("weight")):
            xavier(mx.init.InitDesc(name), fresh)
        elif not name.endswith(RUNNING_MEAN):
            continue
        param.set_data(fresh.astype(param.dtype))


def make_trainer(p: TrainParams, net: gluon.HybridBlock, on_gpu: bool,
                 kvstore: mx.kv.KVStore | None = None) -> gluon.Trainer:
    """With a `dist_sync` kvstore the servers only sum gradients and each worker steps its own
    optimizer on the same sums (update_on_kvstore=False): the weights stay equal, the batch size
    may change between steps, and the optimizer states can be checkpointed like on one node."""
    opts: dict[str, object] = {"learning_rate": lr_at(p, 1), "wd": p.weight_decay}
    if p.optimizer in ("sgd", "nag"):
        opts["momentum"] = 0.9 if p.momentum is None else p.momentum
    if p.dtype == "float16":
        opts["multi_precision"] = True
    if kvstore is not None:
        return gluon.Trainer(net.collect_params(), p.optimizer, opts, kvstore=kvstore,
                             update_on_kvstore=False)
    return gluon.Trainer(net.collect_params(), p.optimizer, opts,
                         kvstore="device" if on_gpu else "local")


def lr_at(p: TrainParams, epoch: int) -> float:
    """The learning rate of epoch `epoch` (from 1) by the job's schedule: a function of the epoch
    alone, so a training resumed at any epoch goes on exactly where it was."""
    if p.lr_schedule == "step":
        every = p.lr_step or max(1, p.epochs // 3)
        return float(p.lr * p.lr_factor ** ((epoch - 1) // every))
    if p.lr_schedule == "cosine":
        return float(p.lr * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / p.epochs)))
    return p.lr


def share_initial_weights(net: gluon.HybridBlock, trainer: gluon.Trainer, ctxs: list[mx.Context],
                          shape: tuple[int, ...], dtype: str) -> None:
    """dist_sync: every worker takes rank 0's initial weights before the first step.

    The Trainer would broadcast them lazily inside the first `step`, where the pull of the
    weights can run after that step's gradient push on the same key and so bring back summed
    gradients as weights. Shapes are inferred first (a forward pass), the broadcast done and
    waited for here."""
    for ctx in ctxs:
        net(mx.nd.zeros((1, *shape), ctx=ctx, dtype=dtype))
    trainer._init_kvstore()  # the Trainer has no public call for these two in 1.9.1
    trainer._init_params()
    mx.nd.waitall()


def accuracy(net: gluon.HybridBlock, data: Dataset, ctx: mx.Context, batch: int, dtype: str,
             on_batch: Callable[[], None] = lambda: None) -> float:
    """The share of `data` whose largest output is its label (a softmax changes no argmax);
    `on_batch` after each batch came back from the device."""
    hits = 0
    for i in range(0, len(data.y), batch):
        x = mx.nd.array(data.x[i:i + batch], ctx=ctx, dtype=dtype)
        hits += int((net(x).argmax(axis=1).asnumpy().astype(np.int32) == data.y[i:i + batch]).sum())
        on_batch()
    return hits / len(data.y)


def shard(count: int, seed: int, rank: int, workers: int) -> NDArray[np.int64]:
    """This worker's samples of one epoch: its equal slice of the seeded order (every worker
    must take the same number of steps in dist_sync; the last count % workers samples of the
    order sit the epoch out)."""
    order = np.random.default_rng(seed).permutation(count)
    each = count // workers
    return order[rank * each:(rank + 1) * each]


FOLD_BATCHES = 64  # the batches' figures are summed on the device every this many batches
# The host waits for the batch this many before the one it just queued: MXNet's engine runs
# asynchronously, and without a wait the loop would queue a whole epoch and then wait for it at
# the epoch's end, so a batch's end (`on_batch`, the device watch's progress) would say nothing
# of the device's. Two batches queued keep the device busy.
SYNC_LAG = 2


class TrainStep(gluon.HybridBlock):  # type: ignore[misc]  # MXNet has no types: its base class is Any
    """Forward, loss and the batch's figures [loss sum, hits] as one compiled graph.

    Computed outside the graph, the figures cost eight small operator calls per device and
    batch, each an engine push; here they ride along the forward pass. Only the per-sample loss
    carries gradients."""

    def __init__(self, net: gluon.HybridBlock, probabilities: bool = False, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.net = net
        # A net that ends in a softmax (a registered version whose outputs are probabilities)
        # is trained on the log of its outputs.
        self.probabilities = probabilities
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss(from_logits=probabilities)

    def hybrid_forward(self, F: Any, x: Any, y: Any) -> tuple[Any, Any]:  # F: Gluon's name (nd or sym)
        out = self.net(x)
        loss = self.loss(F.log(F.maximum(F.cast(out, "float32"), 1e-12)) if self.probabilities else out, y)
        hits = F.sum(F.cast(F.argmax(out, axis=1), "float32") == F.cast(y, "float32"))
        return loss, F.BlockGrad(F.concat(F.sum(F.cast(loss, "float32")), hits, dim=0))


def train_step(net: gluon.HybridBlock, outputs: str = "logits") -> TrainStep:
    step = TrainStep(net, probabilities=outputs == "probabilities")
    step.hybridize(static_alloc=True)
    return step


def run_epoch(step: TrainStep, trainer: gluon.Trainer, data: Dataset, ctxs: list[mx.Context],
              p: TrainParams, epoch: int, on_batch: Callable[[float], None],
              rank: int = 0, workers: int = 1) -> tuple[float, float, float, int]:
    """One pass in a seeded order (this worker's shard of it); returns (mean loss, accuracy,
    seconds, samples). Each of `workers` takes batch_size // workers samples a step and the
    step counts the global batch, whose gradients the kvstore sums. `on_batch` once the device
    finished the batch SYNC_LAG before (the last ones as the epoch's figures are read)."""
    order = shard(len(data.y), p.seed + epoch, rank, workers)
    local = p.batch_size // workers
    # [loss sum, hits] stay on the devices until the epoch ends: no host sync per batch, and
    # one add_n per FOLD_BATCHES batches.
    totals = [mx.nd.zeros(2, ctx=c) for c in ctxs]
    figures: list[list[mx.nd.NDArray]] = [[] for _ in ctxs]
    queued: collections.deque[list[mx.nd.NDArray]] = collections.deque()  # batches not waited for
    began = time.perf_counter()
    steps = range(0, len(order), local)
    for n, i in enumerate(steps):
        idx = order[i:i + local]
        xs = gluon.utils.split_and_load(mx.nd.array(data.x[idx], dtype=p.dtype), ctxs, even_split=False)
        ys = gluon.utils.split_and_load(mx.nd.array(data.y[idx]), ctxs, even_split=False)
        with autograd.record():
            outs = [step(x, y) for x, y in zip(xs, ys, strict=True)]
        for loss, _ in outs:
            loss.backward()
        trainer.step(len(idx) * workers)
        for k, (_, batch_figures) in enumerate(outs):
            figures[k].append(batch_figures)
            if len(figures[k]) == FOLD_BATCHES or n + 1 == len(steps):
                totals[k] = mx.nd.add_n(totals[k], *figures[k])
                figures[k] = []
        queued.append([batch_figures for _, batch_figures in outs])
        if len(queued) > SYNC_LAG:
            for done in queued.popleft():
                done.wait_to_read()
        on_batch((n + 1) / len(steps))
    loss_sum, hit_sum = np.sum([t.asnumpy() for t in totals], axis=0).tolist()
    return loss_sum / len(order), hit_sum / len(order), time.perf_counter() - began, len(order)


def fit(p: TrainParams, train: Dataset, val: Dataset | None, ctxs: list[mx.Context],
        labels: list[str], net: gluon.HybridBlock, trainer: gluon.Trainer, start_epoch: int = 1,
        on_batch: Callable[[int, float], None] = lambda e, f: None,
        on_epoch: Callable[[EpochResult], None] = lambda r: None,
        rank: int = 0, workers: int = 1, outputs: str = "logits") -> list[EpochResult]:
    """Epochs start_epoch..p.epochs; `labels` name the contexts' devices for per-device figures;
    `outputs` says what the net gives (logits, or probabilities: it ends in a softmax).

    With a dist_sync trainer, `rank` of `workers` trains on its shard; the figures are its own."""
    results = []
    local = p.batch_size // workers
    share = np.array_split(np.arange(local), len(ctxs))  # samples each device gets per step
    step = train_step(net, outputs)
    for epoch in range(start_epoch, p.epochs + 1):
        trainer.set_learning_rate(lr_at(p, epoch))
        loss, acc, seconds, n = run_epoch(step, trainer, train, ctxs, p, epoch,
                                          functools.partial(on_batch, epoch), rank, workers)
        val_acc = (accuracy(net, val, ctxs[0], p.batch_size, p.dtype, functools.partial(on_batch, epoch, 1.0))
                   if val is not None else None)
        rates = {label: n * len(s) / local / seconds for label, s in zip(labels, share, strict=True)}
        result = EpochResult(epoch=epoch, train_loss=loss, train_accuracy=acc, val_accuracy=val_acc,
                             seconds=seconds, samples_per_sec=n / seconds, per_device=rates)
        on_epoch(result)
        results.append(result)
    return results
