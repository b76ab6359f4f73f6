"""The job state machine in SQL, on SQLite and PostgreSQL, through the Alembic migration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest
from sqlalchemy import inspect, update
from sqlalchemy.pool import QueuePool

from mxq.db import jobs, registry
from mxq.db.batches import claim_many, finish_batch
from mxq.db.engine import IDLE_IN_TRANSACTION_SECONDS, get_engine, session_scope
from mxq.db.fence import Fence, Superseded
from mxq.db.jobs import Claim, Placement
from mxq.db.outputs import epochs, predictions
from mxq.db.outputs.blocks import Block
from mxq.db.reports import history
from mxq.db.schema import Job
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs

A = Placement(worker="cpu0@n", node="n", device="cpu:0")
B = Placement(worker="cpu1@n", node="n", device="cpu:1")
TTL = 5.0


def _new(stack: Stack) -> int:
    return jobs.create_job(stack.settings.database, "probe", {}, "auto", "pool.cpu")


def _status(stack: Stack, job_id: int) -> Job:
    with session_scope(stack.settings.database) as s:
        return s.get_one(Job, job_id)


def test_migration_creates_tables_and_history_indexes(stack: Stack) -> None:
    insp = inspect(get_engine(stack.settings.database))
    assert {"jobs", "workers", "alembic_version"} <= set(insp.get_table_names())
    indexed = {tuple(ix["column_names"]) for ix in insp.get_indexes("jobs")}
    for cols in [("status", "submitted_at"), ("kind", "submitted_at"),
                 ("device", "submitted_at"), ("node", "submitted_at")]:
        assert cols in indexed


def test_the_migration_connection_is_not_reused(stack: Stack) -> None:
    """Bulk writes through the connection that ran the DDL were slower on PostgreSQL (0.75 of a
    fresh one's rate): upgrade leaves no connection in the pool, and later work opens its own."""
    from mxq.db.migrate import upgrade

    engine = get_engine(stack.settings.database)
    with engine.connect():
        pass  # a pooled connection, as the process would have from earlier work
    assert isinstance(engine.pool, QueuePool) and engine.pool.checkedin() >= 1
    upgrade(stack.settings.database)  # (already at head: runs nothing, still hands the pool back)
    pool = get_engine(stack.settings.database).pool
    assert isinstance(pool, QueuePool) and pool.checkedin() == 0
    assert jobs.create_job(stack.settings.database, "probe", {}, "auto", "pool.cpu") > 0


@pytest.mark.parametrize("top_k", [False, True, "mixed"])
def test_prediction_rows_are_stored_as_written_in_every_shape(stack: Stack, top_k: bool | str) -> None:
    """Rows as tuples (a merged batch's), two jobs interleaved and with a gap in one's indexes:
    each stored once as given, in blocks of consecutive samples (PostgreSQL's binary COPY, SQLite's
    executemany), top-k where given."""
    import numpy as np

    url, job, other = stack.settings.database, _new(stack), _new(stack)
    indexes = [*range(0, 150), *range(170, 237)]

    def top(i: int) -> str | None:
        return f"[[{i % 10}, 0.5]]" if top_k is True or (top_k == "mixed" and i % 3 == 0) else None
    rows = [(j, i, i % 10, float(np.float32(i / 237)), top(i)) for i in indexes for j in (job, other)]
    predictions.write(url, rows)
    for owner in (job, other):
        stored = predictions.read(url, owner)
        mine = [r for r in rows if r[0] == owner]
        assert [(owner, r["index"], r["predicted_class"], r["score"]) for r in stored] == \
            [r[:4] for r in mine]
        expected: list[object] = [None if r[4] is None else [[r[1] % 10, 0.5]] for r in mine]
        assert [r["top_k"] for r in stored] == expected
        assert predictions.count(url, owner) == len(indexes)


def test_prediction_blocks_are_stored_like_their_rows(stack: Stack) -> None:
    """A job's blocks (with and without top-k) beside plain rows: every row stored once, as its
    tuple says, scores exactly."""
    import numpy as np

    url, job = stack.settings.database, _new(stack)
    rng = np.random.default_rng(7)
    scores = rng.random(700, dtype=np.float32)
    plain = [Block(job, 0, np.arange(300) % 10, scores[:300]),
             Block(job, 300, np.arange(300, 600) % 7, scores[300:600])]
    ranked = Block(job, 600, np.arange(50) % 3, scores[600:650], [f"[[{i % 3}, 0.25]]" for i in range(50)])
    rows = [(job, i, 1, float(scores[i]), None) for i in range(650, 700)]
    predictions.write(url, [*plain, ranked, *rows])
    stored = predictions.read(url, job)
    expected = [r for b in (*plain, ranked) for r in b.rows()] + rows
    assert [(job, r["index"], r["predicted_class"], r["score"]) for r in stored] == [r[:4] for r in expected]
    ranks: list[object] = [None] * 600
    ranks += [[[i % 3, 0.25]] for i in range(50)] + [None] * 50
    assert [r["top_k"] for r in stored] == ranks


def test_predictions_are_read_in_pages_across_blocks(stack: Stack) -> None:
    """A page (offset, limit) counts samples in index order, whatever blocks hold them and
    wherever the indexes skip."""
    import numpy as np

    url, job = stack.settings.database, _new(stack)
    firsts, sizes = [0, 100, 130, 500, 520], [100, 30, 70, 20, 5]
    predictions.write(url, [Block(job, f, np.full(n, f % 10), np.full(n, 0.5, dtype=np.float32))
                            for f, n in zip(firsts, sizes, strict=True)])
    whole = predictions.read(url, job)
    assert [r["index"] for r in whole] == [i for f, n in zip(firsts, sizes, strict=True)
                                           for i in range(f, f + n)]
    for offset, limit in [(0, 1), (99, 2), (100, 30), (129, 80), (195, 100), (224, 5), (225, 3), (0, None),
                          (150, None)]:
        assert predictions.read(url, job, limit, offset) == whole[offset:][:limit], (offset, limit)


def test_a_clear_inside_a_block_keeps_its_samples_outside(stack: Stack) -> None:
    """A clear at indexes no write chose trims the blocks across its edges, and a write fills the
    range again: each sample stored once."""
    import numpy as np

    url, job = stack.settings.database, _new(stack)
    predictions.write(url, [Block(job, 0, np.full(100, 1), np.full(100, 0.5, dtype=np.float32),
                                  [f"[[1, {i}]]" for i in range(100)])])
    with session_scope(url) as session:
        predictions.clear(session, [job], 30, 60)
    assert [r["index"] for r in predictions.read(url, job)] == [*range(30), *range(60, 100)]
    ranks: list[object] = [r["top_k"] for r in predictions.read(url, job, 1, 30)]
    assert ranks == [[[1, 60]]]
    predictions.write(url, [Block(job, 30, np.full(30, 2), np.full(30, 0.25, dtype=np.float32))])
    with session_scope(url) as session:
        predictions.clear(session, [job], 90)
    stored = predictions.read(url, job)
    assert [r["index"] for r in stored] == list(range(90))
    assert [r["predicted_class"] for r in stored] == [1] * 30 + [2] * 30 + [1] * 30


def test_an_index_past_int4_is_stored(stack: Stack) -> None:
    """A block's first index is a 64-bit integer on both backends (an input of over 2**31 samples)."""
    import numpy as np

    url, job = stack.settings.database, _new(stack)
    first = 2**31 - 2
    predictions.write(url, [Block(job, first, np.arange(4), np.full(4, 0.5, dtype=np.float32))])
    assert [r["index"] for r in predictions.read(url, job)] == list(range(first, first + 4))


def test_claim_is_taken_once_and_duplicates_dropped(stack: Stack) -> None:
    url = stack.settings.database
    job_id = _new(stack)
    fence = jobs.take(url, job_id, A, 3, TTL)
    assert fence == Fence(job_id, A.worker, 1)
    assert jobs.claim(url, job_id, B, 3, TTL) is Claim.DUPLICATE
    job = _status(stack, job_id)
    assert (job.status, job.worker, job.attempts) == ("running", "cpu0@n", 1)
    assert jobs.succeed(url, fence, 10, 2.0, {"x": 1})
    assert jobs.claim(url, job_id, B, 3, TTL) is Claim.FINISHED
    assert _status(stack, job_id).samples_per_sec == 5.0


def _silence(url: str, job_id: int) -> None:
    """The job's worker went silent 10 s ago (paused, say): the job may be claimed again."""
    from datetime import timedelta

    from mxq.db.schema import utcnow
    with session_scope(url) as s:
        s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - timedelta(seconds=10)))


def test_a_paused_attempt_is_fenced_off_even_on_the_same_worker(stack: Stack) -> None:
    """Worker A is paused past its heartbeat; its job is claimed again, by A's own name (A was
    restarted). Every write of the first attempt is refused; the second's land."""
    url = stack.settings.database
    job_id = _new(stack)
    first = jobs.take(url, job_id, A, 3, TTL)
    _silence(url, job_id)
    second = jobs.take(url, job_id, A, 3, TTL)
    assert isinstance(first, Fence) and isinstance(second, Fence) and second.attempt == 2
    row = (job_id, 0, 1, 0.5, None)
    assert predictions.commit(url, first, [row], 1) is jobs.RunCheck.LOST
    assert predictions.count(url, job_id) == 0
    assert jobs.set_progress(url, job_id, 0.5, first) is jobs.RunCheck.LOST
    assert jobs.run_check(url, first) is jobs.RunCheck.LOST
    assert not epochs.record(url, job_id, {"epoch": 1, "train_loss": 1.0, "train_accuracy": 0.5,
                                           "val_accuracy": None, "seconds": 1.0,
                                           "samples_per_sec": 1.0}, first)
    model: dict[str, Any] = {"name": f"fenced{job_id}", "version": 1, "arch": "mlp", "input_shape": [4],
             "classes": 2, "params_file": "p", "symbol_file": "s", "checksum": "0" * 64,
             "source": f"train:job-{job_id}"}
    with pytest.raises(Superseded):
        registry.add_model(url, model, first)
    assert not jobs.mark_cancelled(url, first) and not jobs.fail(url, job_id, "x", fence=first)
    assert not jobs.succeed(url, first, 1, 1.0, {})
    assert jobs.record_metric(url, second, 0, "cpu:0", 100, 1.0)
    assert not jobs.record_metric(url, first, 0, "cpu:1", 999, 1.0)  # the successor's point stays
    assert [(m["device"], m["samples"]) for m in history.metrics(url, job_id)] == [("cpu:0", 100)]
    assert predictions.commit(url, second, [row], 1) is jobs.RunCheck.GO_ON
    assert predictions.count(url, job_id) == 1
    # The first attempt's resume came late (behind a locked database): it clears nothing.
    assert not predictions.replace_range(url, first, job_id, 0, 1)
    assert predictions.count(url, job_id) == 1
    assert predictions.replace_range(url, second, job_id, 1, 2)  # beyond its committed row
    assert jobs.run_check(url, second) is jobs.RunCheck.GO_ON
    assert registry.add_model(url, model, second)["version"] == 1
    again = registry.add_model(url, {**model, "version": 2}, second)  # one version per training
    assert again["version"] == 1 and len(registry.list_models(url, model["name"])) == 1
    assert jobs.succeed(url, second, 1, 1.0, {})


def test_a_batch_finishes_only_the_members_it_still_holds(stack: Stack) -> None:
    """A dynamic batch on A merged job `taken` whose heartbeat went stale meanwhile, and B ran
    it again: A's finish stores the rows of the jobs it holds, and leaves `taken`'s to B."""
    import numpy as np

    url = stack.settings.database
    lead, kept, taken = _new(stack), _new(stack), _new(stack)
    fence = jobs.take(url, lead, A, 3, TTL)
    assert isinstance(fence, Fence)
    assert claim_many(url, [kept, taken], A) == [kept, taken]
    _silence(url, taken)
    again = jobs.take(url, taken, B, 3, TTL)
    assert isinstance(again, Fence)
    assert predictions.commit(url, again, [(taken, 0, 7, 0.9, None)], 1) is jobs.RunCheck.GO_ON
    rows = [Block(i, 0, np.array([1]), np.array([0.5], dtype=np.float32)) for i in (lead, kept, taken)]
    outcome = (1, 0.1, {"output": "db"})
    assert finish_batch(url, {i: outcome for i in (lead, kept, taken)}, fence, A,
                             rows) == {lead, kept}
    assert [r["predicted_class"] for r in predictions.read(url, taken)] == [7]
    assert [r["predicted_class"] for r in predictions.read(url, kept)] == [1]
    assert (_status(stack, kept).status, _status(stack, taken).status) == ("succeeded", "running")
    assert _status(stack, lead).status == "running"  # its own task finishes it
    _silence(url, lead)
    assert isinstance(jobs.take(url, lead, B, 3, TTL), Fence)
    assert finish_batch(url, {lead: outcome}, fence, A, rows) == set()  # not the lead's any more
    assert [r["predicted_class"] for r in predictions.read(url, lead)] == [1]


def test_status_only_moves_forward(stack: Stack) -> None:
    url = stack.settings.database
    job_id = _new(stack)
    assert not jobs.succeed(url, Fence(job_id, A.worker, 1), 1, 1.0, {})  # queued cannot succeed
    fence = jobs.take(url, job_id, A, 3, TTL)
    assert isinstance(fence, Fence)
    assert jobs.fail(url, job_id, "boom", fence=fence)
    assert not jobs.succeed(url, fence, 1, 1.0, {})  # failed stays failed
    assert not jobs.fail(url, job_id, "again")
    assert jobs.claim(url, job_id, B, 3, TTL) is Claim.FINISHED
    job = _status(stack, job_id)
    assert (job.status, job.error) == ("failed", "boom")


def test_stale_heartbeat_is_reclaimed_until_the_cap(stack: Stack) -> None:
    url = stack.settings.database
    job_id = _new(stack)
    for attempt in (1, 2, 3):
        assert jobs.claim(url, job_id, A, 3, TTL) is Claim.RUN
        assert _status(stack, job_id).attempts == attempt
        assert jobs.orphan(url, A.worker) == [job_id]  # its worker died
    assert jobs.claim(url, job_id, B, 3, TTL) is Claim.EXHAUSTED
    job = _status(stack, job_id)
    assert job.status == "failed" and "gave up after 3 attempts" in (job.error or "")


def test_heartbeat_age_decides_liveness(stack: Stack) -> None:
    url = stack.settings.database
    job_id = _new(stack)
    assert jobs.claim(url, job_id, A, 3, TTL) is Claim.RUN
    with session_scope(url) as s:  # the worker went silent 10 s ago
        from datetime import timedelta

        from mxq.db.schema import utcnow
        s.execute(update(Job).where(Job.id == job_id)
                  .values(heartbeat_at=utcnow() - timedelta(seconds=10)))
    assert jobs.claim(url, job_id, B, 3, TTL) is Claim.RUN
    assert _status(stack, job_id).worker == B.worker


def test_unclaimable_read_agrees_with_the_claim(stack: Stack) -> None:
    """The one-read early drop of a delivery never refuses a job the claim would take."""
    from datetime import timedelta

    from mxq.db.schema import utcnow

    url = stack.settings.database

    def read_then_claim(job_id: int) -> tuple[Claim | None, Claim]:
        job = _status(stack, job_id)
        early = jobs.unclaimable(job.status, job.heartbeat_at, utcnow() - timedelta(seconds=TTL))
        return early, jobs.claim(url, job_id, B, 3, TTL)

    job_id = _new(stack)
    assert read_then_claim(job_id) == (None, Claim.RUN)  # queued
    assert read_then_claim(job_id) == (Claim.DUPLICATE, Claim.DUPLICATE)  # running, live
    with session_scope(url) as s:
        s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - timedelta(seconds=10)))
    assert read_then_claim(job_id) == (None, Claim.RUN)  # running, its worker silent
    assert jobs.succeed(url, Fence(job_id, B.worker, 2), 1, 1.0, {})
    assert read_then_claim(job_id) == (Claim.FINISHED, Claim.FINISHED)


def test_racing_claims_have_one_winner(stack: Stack) -> None:
    url = stack.settings.database
    for _ in range(5):
        job_id = _new(stack)
        results: list[Claim] = []
        barrier = threading.Barrier(4)

        def race(at: Placement, job_id=job_id, results=results, barrier=barrier) -> None:
            barrier.wait()
            results.append(jobs.claim(url, job_id, at, 3, TTL))

        threads = [threading.Thread(target=race, args=(p,))
                   for p in (A, B, *(Placement(f"cpu{i}@m", "m", f"cpu:{i}") for i in (2, 3)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a claim never returned"
        assert sorted(r.value for r in results) == ["duplicate"] * 3 + ["run"]
        assert _status(stack, job_id).attempts == 1


PAUSED_IN_A_TRANSACTION = """
import os, signal, sys
from mxq.db.engine import session_scope
from mxq.db.fence import Fence, still_ours
url, job_id, worker, attempt = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
with session_scope(url) as s:
    assert still_ours(s, Fence(job_id, worker, attempt))  # the job row is locked until commit
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # paused here, inside the transaction
"""


def test_a_process_paused_inside_a_transaction_holds_the_job_row_only_for_a_while(stack: Stack) -> None:
    """A worker SIGSTOPped with its transaction open (it was writing results when it froze) kept
    the job's row locked for as long as it was paused: the reconciler's requeue and the next
    attempt waited behind it. PostgreSQL now ends such a session after
    IDLE_IN_TRANSACTION_SECONDS; the claim goes through, and the resumed writer's commit fails."""
    if stack.name == "embedded":
        pytest.skip("SQLite has no server to end a paused writer's transaction "
                    "(docs/how-it-works.md, Fences)")
    url = stack.settings.database
    job_id = _new(stack)
    first = jobs.take(url, job_id, A, 3, TTL)
    assert isinstance(first, Fence)
    _silence(url, job_id)
    writer = subprocess.Popen([sys.executable, "-c", PAUSED_IN_A_TRANSACTION, url, str(job_id),
                               first.worker, str(first.attempt)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "locked"
        claimed: list[object] = []
        claim = threading.Thread(target=lambda: claimed.append(jobs.take(url, job_id, B, 3, TTL)))
        claim.start()
        claim.join(IDLE_IN_TRANSACTION_SECONDS * 4)  # (unbounded before: as long as the pause)
        assert claimed and isinstance(claimed[0], Fence) and claimed[0].attempt == 2
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        _, err = writer.communicate(timeout=60)
    assert writer.returncode != 0 and "idle-in-transaction" in err  # its commit never landed
    assert _status(stack, job_id).worker == B.worker
