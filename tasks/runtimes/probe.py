"""`probe`: matrix-multiply and convolution throughput on the worker's device, like an env check."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from mxq.tasks.job_context import JobContext, Outcome
from mxq.tasks.runner import job_task
from mxq.tasks.runtimes.mx import mx
from mxq.tasks.runtimes.mx_context import context, memory  # also checks the device at worker start
from mxq.workers.jobs.jobspecs import CONV_FILTERS, CONV_KERNEL, CONV_SHAPE, ProbeParams


class _Pending(Protocol):
    """What `_timed` needs of an MXNet NDArray (MXNet ships no types): its engine computes it
    asynchronously, and `wait_to_read` blocks until it is done."""

    def wait_to_read(self) -> None: ...


def _timed(fn: Callable[[], _Pending], repeat: int, job: JobContext, done: int, total: int,
           limit: int | None) -> float:
    """Seconds `repeat` rounds of `fn` took; rounds `done` + 1.. of `total`. Past the job's time
    `limit` it stops after a round (its only checkpoints: a probe stores nothing until its end)."""
    fn().wait_to_read()  # warm-up: allocation and kernel selection are not throughput
    start = time.perf_counter()
    for i in range(repeat):
        job.check_cancelled()
        fn().wait_to_read()
        job.progress((done + i + 1) / total)
        if done + i + 1 < total:
            job.check_time_limit(limit, f"stopped after round {done + i + 1} of {total}")
    return time.perf_counter() - start


@job_task("probe")
def probe(job: JobContext) -> Outcome:
    p = job.params(ProbeParams)
    ctx = context(job.parsed_device)
    n, batch, repeat = p.size, p.batch, p.repeat
    a = mx.nd.random.uniform(shape=(n, n), ctx=ctx)
    b = mx.nd.random.uniform(shape=(n, n), ctx=ctx)
    x = mx.nd.random.uniform(shape=(batch, *CONV_SHAPE), ctx=ctx)
    w = mx.nd.random.uniform(shape=(CONV_FILTERS, CONV_SHAPE[0], CONV_KERNEL, CONV_KERNEL), ctx=ctx)
    total = 2 * repeat
    mm_seconds = _timed(lambda: mx.nd.dot(a, b), repeat, job, 0, total, p.time_limit)
    conv = lambda: mx.nd.Convolution(x, w, kernel=(CONV_KERNEL,) * 2, num_filter=CONV_FILTERS,  # noqa: E731
                                     no_bias=True, pad=(1, 1))
    conv_seconds = _timed(conv, repeat, job, repeat, total, p.time_limit)
    h, wd = CONV_SHAPE[1:]
    conv_flops = 2 * batch * CONV_FILTERS * h * wd * CONV_SHAPE[0] * CONV_KERNEL**2
    images = batch * repeat
    return Outcome(
        samples=images,
        seconds=mm_seconds + conv_seconds,
        result={
            "matmul_gflops": 2 * n**3 * repeat / mm_seconds / 1e9,
            "conv_gflops": conv_flops * repeat / conv_seconds / 1e9,
            "conv_images_per_sec": images / conv_seconds,
            "matmul_size": n, "conv_batch": batch, "repeat": repeat,
            "mxnet": mx.__version__, "context": str(ctx), **memory(job.parsed_device),
        },
    )
