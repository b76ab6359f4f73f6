"""Run the benchmarks, each against its baseline in the same run, and write a report.

    python -m bench [--quick] [--only CASE[,CASE]] [--out var/bench]

Writes OUT/report.md (machine, date, aim vs measured with pass/miss, one section per case),
OUT/*.png (matplotlib plots) and OUT/results.json (every figure). Each case runs on a stack of
its own (embedded Redis + SQLite in a fresh home under OUT/tmp, removed afterwards unless the
case failed). Cases: inference, objects (the inference case from a bucket), scaling, dispatch,
batching, writes, training, memory, engines, fleet, sharing, webhooks, sqlrows.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import markdown as report
from bench.report import plots
from bench.report.checks import checks
from mxq.errors import typed_line

# Sizes: quick (checks that each case works, in seconds) and full (the figures to judge by).
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "inference": {"quick": {"samples": 5_000}, "full": {"samples": 200_000}},
    # 50,000 samples (157 MB): moto's server copies a whole object for every ranged GET, a cost
    # no S3 has, which would swamp a larger input's figure.
    "objects": {"quick": {"samples": 5_000, "rounds": 1}, "full": {"samples": 50_000, "rounds": 3}},
    "scaling": {"quick": {"per_core": 3_000, "rounds": 1}, "full": {"per_core": 60_000, "rounds": 2}},
    "dispatch": {"quick": {"jobs": 30, "latency_jobs": 8}, "full": {"jobs": 500, "latency_jobs": 50}},
    "batching": {"quick": {"jobs": 100}, "full": {"jobs": 1_000}},
    "writes": {"quick": {"rows": 20_000, "rounds": 2}, "full": {"rows": 500_000, "rounds": 3}},
    "training": {"quick": {"copies": 1, "epochs": 1}, "full": {"copies": 10, "epochs": 5}},
    "memory": {"quick": {"samples": 5_000}, "full": {"samples": 50_000}},
    "engines": {"quick": {"scale": 0.004, "epochs": 1, "rounds": 1, "generated": 200},
                "full": {"scale": 1.0, "epochs": 3, "rounds": 2}},
    "sharing": {"quick": {"tries": 3, "backlog": 20, "job_seconds": 3.0, "fair_jobs": 30},
                "full": {"tries": 20, "backlog": 200, "job_seconds": 5.0, "fair_jobs": 300}},
    # quick: CI's smoke test of the slow tier (tests/benchmarks/test_bench_fleet.py), kept short
    "fleet": {"quick": {"devices": [10, 30], "jobs": 1_000, "jobs_per_device": 25, "window": 12.0,
                        "scale": 0.02, "history": 50_000, "heartbeat": 0.5, "reconcile_every": 2.0,
                        "drain": True, "idle_seconds": 8.0},
              "full": {"devices": [10, 100, 1000], "jobs": 100_000, "window": 180.0, "scale": 2.0,
                       "history": 10_000_000, "heartbeat": 5.0, "reconcile_every": 30.0,
                       "drain": False}},
    "webhooks": {"quick": {"deliveries": 200}, "full": {"deliveries": 4_000}},
    "sqlrows": {"quick": {"samples": 20_000, "rounds": 1}, "full": {"samples": 400_000, "rounds": 3}},
}
CASES = list(SIZES)


# Each case's module and function, imported late, so `--only writes` never loads MXNet.
RUNNERS = {"inference": ("bench.infer_overhead", "run_inference"),
           "memory": ("bench.infer_overhead", "run_memory"), "scaling": ("bench.scaling", "run"),
           "dispatch": ("bench.dispatch.case", "run"), "batching": ("bench.dynamic_batching", "run"),
           "training": ("bench.train_overhead", "run"), "writes": ("bench.writes", "run"),
           "engines": ("bench.engines", "run"), "fleet": ("bench.fleet.case", "run"),
           "sharing": ("bench.sharing", "run"), "objects": ("bench.object_storage", "run"),
           "webhooks": ("bench.webhook_rate", "run"), "sqlrows": ("bench.outputs.sql_rows", "run")}


def _runner(case: str, postgres: str | None) -> Callable[..., dict[str, Any]]:
    """The case's function (the PostgreSQL URL goes to the writes, sqlrows and fleet cases)."""
    module, name = RUNNERS[case]
    run = getattr(importlib.import_module(module), name)
    return (lambda **kw: run(postgres=postgres, **kw)) if case in ("writes", "sqlrows", "fleet") else run


def parse_only(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown case(s) {', '.join(unknown) if unknown else repr(value)}; "
                                         f"known: {', '.join(CASES)}")
    return [c for c in CASES if c in names]  # the report keeps one order


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes: checks every case works (the ratios mean little)")
    ap.add_argument("--only", type=parse_only, default=CASES, metavar="CASE[,CASE]",
                    help=f"run only these cases, of: {', '.join(CASES)}")
    ap.add_argument("--out", type=Path, default=Path("var/bench"), help="report folder")
    ap.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test",
                    help="server for the writes and sqlrows cases' scratch databases and the fleet "
                    "case's history database ('' to skip their PostgreSQL legs)")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in [*CASES, "summary"]:  # this report's plots from an earlier run, nothing else
        (out / f"{name}.png").unlink(missing_ok=True)
    tmp = out / "tmp"
    mode = "quick" if args.quick else "full"
    results: dict[str, Any] = {
        "date": report.now(), "quick": args.quick, "machine": report.machine(),
        "command": shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])]),
        "cases": {}}
    started = time.perf_counter()
    print(f"mxq benchmarks ({mode}): {', '.join(args.only)}; report in {out}", flush=True)
    for case in args.only:
        params = SIZES[case][mode]
        print(f"\n== {case}: {report.TITLES[case].replace('`', '')}", flush=True)
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"title": report.TITLES[case], "params": params}
        try:
            result = _runner(case, args.postgres or None)(root=tmp, **params)
            entry.update(status="ok", result=result, ratio=result.get("ratio"),
                         checks=checks(case, result))
            aimed = [c["pass"] for c in entry["checks"] if c["pass"] is not None]
            entry["pass"] = all(aimed) if aimed else None
            entry["plot"] = plots.plot_case(case, result, out)
        except Exception as exc:  # one broken case must not lose the others' figures
            traceback.print_exc()
            entry.update(status="error", error=typed_line(exc, 300),
                         ratio=None, checks=[], **{"pass": None})
        entry["seconds"] = time.perf_counter() - t0
        results["cases"][case] = entry
        results["seconds"] = time.perf_counter() - started
        results["load_average_end"] = report.machine()["load_average"]
        report.write(results, out)  # after each case: a long run that is stopped keeps its figures
    results["summary_plot"] = plots.plot_summary(results, out)
    report.write(results, out)
    if tmp.is_dir() and not any(tmp.iterdir()):
        tmp.rmdir()
    print(f"\n== summary ({mode}, {results['seconds'] / 60:.1f} min)")
    for row in report.summary_rows(results):
        print("  " + " | ".join(row).replace("**", ""))
    print(f"\nreport: {out / 'report.md'}\nfigures: {out / 'results.json'}")
    return 1 if any(e["status"] == "error" for e in results["cases"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
