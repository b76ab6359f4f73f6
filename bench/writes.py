"""Result writes: prediction rows/s through `db.predictions.write` against a bare bulk insert,
on SQLite and PostgreSQL, same run.

Both sides write the same rows in the same batches (the worker's flush size) to the same
migrated database, one transaction per batch: mxq as a worker holds them (a block of NumPy columns
per read, `blocks.Block`) into its `predictions` table (a row per block); the bare side as tuples
into a table of a row per sample keyed by (job, index), `BARE_TABLE`, as a plain schema would
store them. Bare SQLite: the sqlite3 module's executemany on a connection with the pragmas mxq's
engine sets (WAL, foreign keys). Bare PostgreSQL: psycopg's COPY, row by row. Rounds alternate,
and each side's median counts.

    python -m bench.writes [--rows 500000] [--postgres postgresql://127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bench.stack import scratch
from mxq.db.jobs import create_job
from mxq.db.migrate import upgrade
from mxq.db.outputs import predictions
from mxq.db.outputs.blocks import Block, Row
from mxq.errors import first_line

BATCH = 20_000  # rows per write, as tasks.infer.FLUSH_ROWS (importing it would load MXNet)
READ = 4_000  # rows per block (a read's), a divisor of BATCH
POSTGRES = "postgresql://127.0.0.1:5432/test"

Writer = Callable[[list[Row]], None]
COLUMNS = ("job_id", "idx", "predicted_class", "score", "top_k")
BARE_TABLE = ("CREATE TABLE bare_predictions (job_id INTEGER, idx INTEGER, predicted_class INTEGER NOT NULL, "
              "score FLOAT NOT NULL, top_k TEXT, PRIMARY KEY (job_id, idx))")


def make_rows(job_id: int, n: int, seed: int = 0) -> list[Row]:
    """The rows of `make_blocks` as tuples (what a table of a row per sample is sent)."""
    return [r for b in make_blocks(job_id, n, seed) for r in b.rows()]


def make_blocks(job_id: int, n: int, seed: int = 0) -> list[Block]:
    """The same rows as a worker holds them: a block of NumPy columns per read of READ rows."""
    rng = np.random.default_rng(seed)
    classes, scores = rng.integers(0, 10, n), rng.random(n, dtype=np.float32)
    return [Block(job_id, i, classes[i:i + READ], scores[i:i + READ]) for i in range(0, n, READ)]


def sqlite_bare(path: Path) -> tuple[Writer, Callable[[], None]]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(f"{BARE_TABLE} WITHOUT ROWID")
    sql = f"INSERT INTO bare_predictions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"  # noqa: S608

    def write(rows: list[Row]) -> None:
        conn.execute("BEGIN")
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    return write, conn.close


def postgres_bare(url: str) -> tuple[Writer, Callable[[], None]]:
    import psycopg

    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    conn.execute(BARE_TABLE)
    copy_sql = f"COPY bare_predictions ({', '.join(COLUMNS)}) FROM STDIN"

    def write(rows: list[Row]) -> None:
        with conn.transaction(), conn.cursor() as cur, cur.copy(copy_sql) as copy:
            for row in rows:
                copy.write_row(row)
    return write, conn.close


def measure(url: str, bare: Writer, rows: int, rounds: int) -> dict[str, Any]:
    """Median rows/s of each side over `rounds` alternating rounds, each into a job of its own."""
    def timed_bare() -> float:
        job_id = create_job(url, "infer", {}, "auto", "pool.cpu")
        data = make_rows(job_id, rows, seed=job_id)
        start = time.perf_counter()
        for i in range(0, rows, BATCH):
            bare(data[i:i + BATCH])
        return rows / (time.perf_counter() - start)

    def timed_mxq() -> float:  # the blocks of a worker's flushes, as it writes them
        job_id = create_job(url, "infer", {}, "auto", "pool.cpu")
        blocks, each = make_blocks(job_id, rows, seed=job_id), BATCH // READ
        start = time.perf_counter()
        for i in range(0, len(blocks), each):
            predictions.write(url, blocks[i:i + each])
        return rows / (time.perf_counter() - start)

    timed_mxq()  # warm-up: engine, connection, page cache
    mxq: list[float] = []
    base: list[float] = []
    for r in range(rounds):
        pair: list[tuple[list[float], Callable[[], float]]] = [(mxq, timed_mxq), (base, timed_bare)]
        for into, timed in (pair if r % 2 == 0 else pair[::-1]):
            into.append(timed())
    result: dict[str, Any] = {"rows": rows, "batch": BATCH, "rounds": rounds, "mxq": statistics.median(mxq),
              "bare": statistics.median(base), "mxq_runs": mxq, "bare_runs": base}
    result["ratio"] = result["mxq"] / result["bare"]
    return result


@contextmanager
def scratch_postgres(server: str) -> Iterator[str]:
    """A scratch database on `server`, dropped afterwards."""
    import psycopg

    from mxq.db.engine import get_engine

    name = f"mxq_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        get_engine(url).dispose()
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def postgres_reachable(server: str) -> str | None:
    """None when a scratch database can be made on `server`, else why not."""
    import psycopg

    try:
        with psycopg.connect(server, autocommit=True, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return first_line(exc)


def run(rows: int = 500_000, rounds: int = 3, postgres: str | None = POSTGRES,
        root: Path | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"rows": rows, "batch": BATCH}
    with scratch(root, "writes-") as home:
        url = f"sqlite:///{home / 'mxq.db'}"
        upgrade(url)
        bare, close = sqlite_bare(home / "mxq.db")
        try:
            result["sqlite"] = measure(url, bare, rows, rounds)
        finally:
            close()
            from mxq.db.engine import get_engine

            get_engine(url).dispose()
    _show("SQLite", result["sqlite"], "executemany")

    def on_postgres(url: str) -> dict[str, Any]:
        upgrade(url)
        bare, close = postgres_bare(url)
        try:
            measured = measure(url, bare, rows, rounds)
        finally:
            close()
        _show("PostgreSQL", measured, "COPY")
        return measured

    result["postgresql"] = postgres_leg(postgres, on_postgres)
    result["ratio"] = lowest_ratio(result)
    return result


def postgres_leg(postgres: str | None, measure: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """`measure(url)` on a scratch database of `postgres`, or why that leg was skipped."""
    why = postgres_reachable(postgres) if postgres else "not asked (--postgres '')"
    if why is not None or not postgres:
        print(f"  PostgreSQL: skipped: no PostgreSQL at {postgres}: {why}")
        return {"skipped": f"no PostgreSQL at {postgres}: {why}"}
    with scratch_postgres(postgres) as url:
        return measure(url)


def lowest_ratio(result: dict[str, Any]) -> float:
    """The case's ratio: its SQLite leg's or its PostgreSQL leg's, whichever is lower."""
    return float(min(r["ratio"] for r in (result["sqlite"], result["postgresql"]) if "ratio" in r))


def _show(name: str, r: dict[str, Any], bare: str) -> None:
    print(f"  {name:10s} bare {bare:11s} {r['bare']:10,.0f} rows/s | predictions.write "
          f"{r['mxq']:10,.0f} rows/s | ratio {r['ratio']:.3f}", flush=True)


def two_backends_main(doc: str, size: str, default: int,
                      run_case: Callable[[int, int, str | None], object]) -> None:
    """The command line of a case run on SQLite and on a `--postgres` server: `--SIZE` (rows or
    samples), `--rounds`, `--postgres` ('' skips that leg)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument(f"--{size}", type=int, default=default)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--postgres", default=POSTGRES, help="a server where a scratch database can be "
                    "created ('' to skip)")
    args = ap.parse_args()
    run_case(getattr(args, size), args.rounds, args.postgres or None)


def main() -> None:
    two_backends_main(__doc__, "rows", 500_000, run)


if __name__ == "__main__":
    main()
