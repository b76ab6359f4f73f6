"""Predictions as SQL rows against the same job's `.npy`: the engines case's MLP (the fastest
model, so the one whose job the rows' writes bound), on SQLite and on PostgreSQL, same run.

Each backend gets a stack of its own (`mxq worker`, embedded Redis; the embedded SQLite, or a
scratch database on `--postgres`), one built-in MLP version and one input. A first job measures
the engines; then an `--output npy` job and an `--output db` job alternate, `rounds` each, and
each side's best rate counts (rates cover a job's batches and writes, not its start: see its
`fixed_costs`). The aim (issue 61): SQL rows at half the `.npy` rate or more.

    python -m bench.outputs.sql_rows [--samples 400000] [--postgres postgresql://127.0.0.1:5432/test]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.engines import alternated
from bench.infer_overhead import make_input
from bench.stack import rate, running_stack, wait_job
from bench.writes import POSTGRES, lowest_ratio, postgres_leg, two_backends_main
from mxq.json_types import JsonObject
from mxq.workers.settings import Settings

ARCH, SHAPE, BATCH = "mlp", (256,), 512  # as the engines case's MLP


def _jobs(s: Settings, samples: int, rounds: int) -> dict[str, Any]:
    """The best `.npy` and SQL-rows rates of the MLP on this stack's database."""
    from mxq.tasks.model_store.mxnet.versions import add_builtin
    from mxq.workers.jobs.submit import submit

    add_builtin(s, ARCH, ARCH, SHAPE, 10)
    path = make_input(s.home_path / f"{ARCH}.npy", samples, SHAPE)
    params: JsonObject = {"model": ARCH, "input": str(path), "batch_size": BATCH, "engine": "auto"}
    wait_job(s, submit(s, "infer", {**params, "output": "npy"}, "cpu:0"))  # measures the engines

    def job(output: str) -> float:
        return rate(wait_job(s, submit(s, "infer", {**params, "output": output}, "cpu:0")))

    best = alternated({"npy": lambda: job("npy"), "db": lambda: job("db")}, rounds)
    return {"npy": best["npy"], "db": best["db"], "ratio": best["db"] / best["npy"]}


def run(samples: int = 400_000, rounds: int = 3, postgres: str | None = POSTGRES,
        root: Path | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"samples": samples, "rounds": rounds, "batch_size": BATCH}
    with running_stack(root=root, prefix="sqlrows-") as s:
        result["sqlite"] = _jobs(s, samples, rounds)
    _show("SQLite", result["sqlite"])

    def on_postgres(url: str) -> dict[str, Any]:
        with running_stack(root=root, prefix="sqlrows-pg-", env={"MXQ_DATABASE_URL": url}) as s:
            measured = _jobs(s, samples, rounds)
        _show("PostgreSQL", measured)
        return measured

    result["postgresql"] = postgres_leg(postgres, on_postgres)
    result["ratio"] = lowest_ratio(result)
    return result


def _show(name: str, r: dict[str, Any]) -> None:
    print(f"  {name:10s} MLP --output npy {r['npy']:12,.0f} samples/s | --output db (SQL rows) "
          f"{r['db']:12,.0f} samples/s | ratio {r['ratio']:.3f}", flush=True)


def main() -> None:
    two_backends_main(__doc__, "samples", 400_000, run)


if __name__ == "__main__":
    main()
