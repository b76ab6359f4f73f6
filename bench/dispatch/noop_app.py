"""The bare-Celery baseline of the dispatch benchmark: one no-op task on mxq's broker, with
mxq's transport settings (JSON, late acks, prefetch 1, no result backend: workers.app).

Each run bumps a counter in Redis and records when it ran; when given the time it was sent,
it also records its submit-to-start latency. Configured by BENCH_BROKER (the Celery broker URL)
and BENCH_REDIS (the same Redis as a redis-py URL).
"""

from __future__ import annotations

import os
import time
from functools import lru_cache

import redis
from celery import Celery

from mxq.workers.broker.app import celery_config
from mxq.workers.settings import Settings

QUEUE = "bench.noop"
TASK = "bench.noop"
COUNT, LAST, LATENCY = "bench:count", "bench:last", "bench:latency"

app = Celery("bench")
app.conf.update({k: v for k, v in celery_config(Settings(broker_url=os.environ.get(
    "BENCH_BROKER", "redis://127.0.0.1:6379/0"))).items() if k != "beat_schedule"})


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0"))


@app.task(name=TASK)
def noop(sent_at: float | None = None) -> None:
    now = time.time()
    pipe = _redis().pipeline(transaction=False)
    if sent_at is not None:
        pipe.rpush(LATENCY, now - sent_at)
    pipe.incr(COUNT)
    pipe.set(LAST, now)
    pipe.execute()
