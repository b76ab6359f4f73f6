"""Each case's checks in the benchmark report: its figures against the aims of the issues that
set them (`AIMS`), one row per check with its baseline, measure, ratio and pass or miss."""

from __future__ import annotations

from typing import Any

from bench.fleet import report as fleet_report

# Aims from the performance issue: (operator, value) on the ratio of a check.
AIMS: dict[str, tuple[str, float]] = {
    "inference": (">=", 0.95), "training": (">=", 0.95), "scaling": (">=", 1.7),
    "batching": (">=", 5.0), "writes": (">=", 0.8), "memory": ("<=", 1.10), "engines": (">=", 0.9),
    "fleet": ("<=", 1.0),  # each figure over its aim (bench.fleet.report)
    "sharing": ("<=", 1.0),  # each figure over its aim (_sharing_checks)
    "objects": (">=", 0.8),  # issue 33: from a bucket at least 0.8 of the local file's samples/s
    "webhooks": (">=", 1.0),  # issue 58: at least WEBHOOK_FLOOR deliveries a second
    "sqlrows": (">=", 0.5),  # issue 61: SQL rows at half the .npy rate or more
}
WEBHOOK_FLOOR = 50.0
EMBEDDING_AIM = (">=", 0.9)  # issue 48: the inference case's embedding job against its bare loop


def _check(check: str, unit: str, base_label: str, base: float | None, label: str,
           value: float | None, ratio: float | None, case: str | None = None,
           note: str = "", aim: tuple[str, float] | None = None) -> dict[str, Any]:
    aim = aim or (AIMS.get(case) if case else None)
    passed = None
    if aim is not None and ratio is not None:
        passed = ratio >= aim[1] if aim[0] == ">=" else ratio <= aim[1]
    return {"check": check, "unit": unit, "baseline_label": base_label, "baseline": base,
            "measured_label": label, "measured": value, "ratio": ratio,
            "aim": f"{aim[0]} {aim[1]:g}" if aim else None, "pass": passed, "note": note}


def checks(case: str, r: dict[str, Any]) -> list[dict[str, Any]]:
    """The report rows of one case's result."""
    own = {"fleet": fleet_report.checks, "sharing": _sharing_checks,  # aims of their own
           "objects": _objects_checks, "webhooks": _webhook_checks, "sqlrows": _sql_rows_checks}.get(case)
    if own is not None:
        return own(r)
    if case == "engines":
        return [_check(f"{m['arch']} samples/s", "samples/s", f"bare {m['best_bare']}",
                       m["bare"][m["best_bare"]], f"mxq infer --precision auto ({m['engine']}, "
                       f"{m['precision']}), --output npy", m["mxq_precision"], m["ratio"], case,
                       note=f"fp32 --engine auto {m['mxq_auto']:,.0f} ({m['ratio_fp32']:.2f} of bare "
                       f"{m['faster_bare']}), with SQL rows {m['mxq_auto_sql']:,.0f} samples/s; "
                       f"agreement int8 {m['int8']['agreement']:.2%}, fp16 {m['fp16']['agreement']:.2%}; "
                       f"{against_peak(m, r['peak'])}")
                for m in r["models"]]
    if case == "inference":
        return [_check("samples/s, one device", "samples/s", "bare MXNet loop", r["bare"],
                       "mxq infer (job)", r["mxq"], r["ratio"], case),
                _check("samples/s, submit to done", "samples/s", "bare MXNet loop", r["bare"],
                       "mxq infer (end to end)", r["mxq_end_to_end"], r["ratio_end_to_end"],
                       note="for information: includes queueing and the last write"),
                _embedding_check(r["embedding"])]
    if case == "scaling":
        return [_check("samples/s, one job in 2 chunks", "samples/s", "1 device", r["one_device"],
                       "2 devices", r["two_devices"], r["ratio"], case,
                       note="ideal 2x" + ("" if r["spread_over_both"] else
                                          "; the chunks did NOT run on both devices"))]
    if case == "dispatch":
        lat, bare = r["latency_ms"], r["bare_latency_ms"]
        return [_check("tiny jobs/s", "jobs/s", "bare Celery no-op", r["bare"]["tasks_per_sec"],
                       "mxq probe", r["mxq"]["jobs_per_sec"], r["ratio"], note="no aim"),
                _check("submit-to-start p50, idle worker", "ms", "bare Celery", bare["p50"], "mxq",
                       lat["p50"], None, note="no aim"),
                _check("submit-to-start p95, idle worker", "ms", "bare Celery", bare["p95"], "mxq",
                       lat["p95"], None, note="no aim")]
    if case == "batching":
        return [_check(f"{r['jobs']} single-sample jobs/s", "jobs/s", "batching off",
                       r["off"]["jobs_per_sec"], "batching on", r["on"]["jobs_per_sec"], r["ratio"],
                       case, note=f"{r['on']['mean_jobs_per_batch']:.0f} jobs per batch when on")]
    if case == "writes":
        legs = (("sqlite", "SQLite", "executemany"), ("postgresql", "PostgreSQL", "COPY"))
        return [_leg_check(r[key], f"rows/s, {name}", "rows/s", (f"bare {bare}", "bare"),
                           ("predictions.write", "mxq"), case) for key, name, bare in legs]
    if case == "training":
        return [_check(f"samples/s, {name}, {k} device{'s' if k != '1' else ''}", "samples/s",
                       "bare loop", d["bare"], how, d["mxq"], d["ratio"], case)
                for name, how, rows in training_cases(r) for k, d in rows.items()]
    if case == "memory":
        return [_check("worker peak RSS, 10x input vs 1x", "MiB", f"1x ({r['samples']:,} samples)",
                       r["peak_rss_1x_mib"], f"10x ({r['samples_10x']:,})", r["peak_rss_10x_mib"],
                       r["ratio"], case)]
    raise KeyError(case)


def _embedding_check(e: dict[str, Any]) -> dict[str, Any]:
    """The inference case's embedding job against its bare loop, on the engine the job ran."""
    return _check(f"samples/s, embedding ({e['width']}-d)", "samples/s", f"bare {e['engine']} loop",
                  e["bare"], f"mxq infer --output {e['output']} ({e['engine']})", e["mxq"], e["ratio"],
                  aim=EMBEDDING_AIM, note=f"max |diff| {e['max_abs_diff']:.1e}")


def training_cases(r: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The training case's architectures: (name, how mxq trains it, its rows by device count)."""
    return [("lenet", "mxq train (job)", r["devices"]),
            ("user CNN", "mxq train --from (job)", r.get("user") or {}),
            ("user CNN code", "mxq train, arch add (job)", r.get("user_code") or {})]


def _objects_checks(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Throughput from a bucket against the local file (issue 33), and the memory it costs."""
    return [_check("samples/s, one device", "samples/s", "local .npy", r["local"], "s3:// .npy",
                   r["s3"], r["ratio"], "objects"),
            _check("worker peak RSS", "MiB", "after the local job", r["peak_rss_local_mib"],
                   "after the S3 jobs", r["peak_rss_s3_mib"], r["memory_ratio"], "memory")]


def _webhook_checks(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The delivery rate over the issue's floor (the aim), and beside the bare POSTs (no aim)."""
    return [_check("deliveries/s, endpoints that answer at once", "deliveries/s", "floor",
                   WEBHOOK_FLOOR, "mxq sender", r["mxq"], r["mxq"] / WEBHOOK_FLOOR, "webhooks",
                   note=f"{r['deliveries']:,} deliveries to {r['endpoints']} endpoints"),
            _check("deliveries/s against bare POSTs", "deliveries/s", "bare POSTs, 8 threads",
                   r["bare"], "mxq sender", r["mxq"], r["ratio"], note="no aim: mxq also claims, "
                   "checks and records each one in SQL")]


def _sharing_checks(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure of the sharing case over its own aim (issue 32): a ratio of at most 1 passes."""
    plain, pre = r["no_preemption"], r["preemption"]
    rows = [_check("urgent start p95, no preemption", "s", "one backlog job", r["job_seconds"],
                   "high job's submit to start", plain["p95"], plain["p95"] / r["job_seconds"],
                   aim=("<=", 1.0), note=f"p50 {plain['p50']:.2f} s; aim: at most one running "
                   "job's remaining time"),
            _check("urgent start p95, preemption", "s", "aim", 2.0, "high job's submit to start",
                   pre["p95"], pre["p95"] / 2.0, aim=("<=", 1.0),
                   note=f"p50 {pre['p50']:.2f} s; aim: under 2 s")]
    fair = r["fair"]
    rows.append(_check("fair share: weight 3's device-seconds, weights 1 and 3", "%", "aim", 75.0,
                       "measured", 100 * fair["w3_share"], abs(fair["w3_share"] / 0.75 - 1) / 0.1,
                       aim=("<=", 1.0), note=f"within 10 % of 75 %: the ratio is the miss over 10 %; "
                       f"{fair['contended_seconds']:.0f} s contended, {fair['per_user']} jobs each"))
    rows.append(_check("quota: most devices at once of a 1-device user", "devices", "quota",
                       fair["capped_quota"], "measured", fair["capped_most_devices"],
                       fair["capped_most_devices"] / fair["capped_quota"], aim=("<=", 1.0)))
    for c in r["cost"]:
        rows.append(_check(f"samples computed twice per preemption, {c['engine']}", "samples",
                           "one flush", c["flush_samples"], "computed twice", c["computed_twice"],
                           c["computed_twice"] / max(c["flush_samples"], 1.0), aim=("<=", 1.0),
                           note=f"{c['preemptions']} preemption(s); {c['stored']:,} rows for "
                           f"{c['samples']:,} samples, {c['unique']:,} distinct; classes equal to "
                           f"an uninterrupted run: {c['classes_equal']}, max score diff "
                           f"{c['max_score_diff']:.1e}"))
    return rows


def _sql_rows_checks(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each backend's row of the sqlrows case: the SQL-rows job against the `.npy` one."""
    return [_leg_check(r[key], f"MLP samples/s, SQL rows, {name}", "samples/s", ("--output npy", "npy"),
                       ("--output db", "db"), "sqlrows")
            for key, name in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))]


def _leg_check(leg: dict[str, Any], label: str, unit: str, base: tuple[str, str],
               measured: tuple[str, str], case: str) -> dict[str, Any]:
    """The row of one database leg of a case: (label, key) of its baseline and of its measure in
    `leg`, or the leg's reason for being skipped."""
    if "skipped" in leg:
        return {**_check(label, unit, base[0], None, measured[0], None, None, case), "pass": None,
                "skipped": leg["skipped"]}
    return _check(label, unit, base[0], leg[base[1]], measured[0], leg[measured[1]], leg["ratio"], case)


def against_peak(m: dict[str, Any], peak: dict[str, Any]) -> str:
    """A model's achieved rate beside the peak of the precision it ran in: int8 operations
    against the int8 peak, float32 and float16 (computed in float32 where the CPU has no float16
    kernel) against the float32 one."""
    if m["precision"] == "int8":
        return (f"{m['gflops']:,.1f} G int8 op/s = {m['gflops'] / peak['int8_gops']:.1%} of the int8 "
                f"peak {peak['int8_gops']:,.0f} G op/s ({'VNNI' if peak['vnni'] else 'no VNNI'})")
    return (f"{m['gflops']:,.1f} GFLOP/s = {m['gflops'] / peak['gflops']:.1%} of the float32 peak "
            f"{peak['gflops']:,.0f} GFLOP/s")
