"""The benchmark report: the machine, each case's checks (aim against measured), PNG plots and
the Markdown that ties them together."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
from datetime import UTC, datetime
from pathlib import Path
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

TITLES = {
    "inference": "Inference: `mxq infer` vs a bare MXNet loop",
    "objects": "Object storage: `mxq infer` from an s3:// object vs the same local file",
    "scaling": "Device scaling: 2 CPU devices vs 1",
    "dispatch": "Dispatch: tiny jobs through mxq vs bare Celery",
    "batching": "Dynamic batching: on vs off",
    "writes": "Result writes: `db.predictions.write` vs a bare bulk insert",
    "training": "Training: `mxq train` vs the bare data-parallel loop",
    "memory": "Memory: worker peak RSS at 1x and 10x input",
    "engines": "Engines: `mxq infer --precision auto` vs bare MXNet, ONNX Runtime, int8 and fp16",
    "fleet": "Fleet: 10 to 1,000 simulated devices on one Redis and one PostgreSQL",
    "sharing": "Sharing: an urgent job on devices saturated by low-priority work, and a preemption's cost",
    "webhooks": "Webhooks: the sender's deliveries/s vs bare POSTs, to endpoints that answer at once",
    "sqlrows": "SQL rows: the MLP's `mxq infer --output db` vs the same job's `--output npy`",
}

ABOUT = {
    "sqlrows": "The engines case's MLP (256 inputs, batch 512, `--engine auto`), the fastest model "
    "and so the one whose job its rows' writes bound, over one input on a stack of its own per "
    "backend (the embedded SQLite; a scratch PostgreSQL database): an `--output npy` job and an "
    "`--output db` job alternate, each side's best rate counts. Rates cover a job's batches and "
    "writes, not its start (its result's `fixed_costs`).",
    "webhooks": "N `job.failed` events for two endpoints on a loopback HTTP server that answers 200 "
    "at once, delivered by the schedule process's sender (`send_due`: 8 threads, each claiming "
    "the next due outbox row in SQL, checking and resolving the endpoint, signing, POSTing on a "
    "new connection and recording the answer) against the same signed bodies POSTed by 8 bare "
    "threads that record nothing. The aim is the issue's floor: 50 deliveries a second.",
    "inference": "The same registered LeNet over the same `.npy` input with the same batch size, "
    "through `mxq infer` on one device (results stored in SQL) and through the plain loop a user "
    "would write (read a batch, forward, softmax, to NumPy), run in a process pinned to the "
    "worker's cores with the worker's thread limits, three runs of each, alternating (medians). mxq's "
    "figure is the job's own samples/s; submit-to-done (with queueing and the final write) is "
    "shown for information. Then an embedding model (a CNN without its classifier layer, 128-d, "
    "registered with `--outputs embedding`) over the same input: `mxq infer --output npy` against "
    "the bare loop on the engine the job ran, which keeps its array too (to NumPy, `np.save` at "
    "the end); the job's values must equal the bare loop's within 1e-5.",
    "objects": "The inference case's LeNet and `.npy` input, one job from the local file and one "
    "from the same object on moto's S3 server on loopback (ranged GETs of 8 MiB blocks, two ahead), "
    "alternating (medians), after one small job of each (the worker's first S3 job imports boto3 "
    "and makes its client, once). The worker's peak RSS (VmHWM) is read after the first local job "
    "and after every S3 one: the aim is no more memory for the object. moto's server shares the "
    "machine's cores and copies a whole object for every ranged GET, so the S3 figure is a floor.",
    "scaling": "One input sized to the machine, split with `--chunk-size` = half of it: on two "
    "CPU devices the two chunks run side by side, on one (`--device cpu:0`) in turn. Each CPU "
    "device worker is pinned to its own share of the cores with that many MXNet/OpenMP threads "
    "(on a 2-core machine: one core each), so the ideal is 2x. The bench process, Redis and the "
    "SQL writes share the same cores.",
    "dispatch": "Throughput: N `probe` jobs (size 16, repeat 1, batch 1) queued with one "
    "`submit_many` on a one-device stack, against N no-op tasks of a trivial Celery app run by "
    "`celery worker --pool solo` with mxq's flags and transport settings (late acks, prefetch 1, "
    "JSON, events) on the same embedded Redis and the same cores. Latency: jobs submitted one at a "
    "time with a pause between, on an idle worker: the job's `submitted_at` to `started_at` "
    "(bare: send to task start). There is no aim: this shows what mxq's per-job bookkeeping "
    "(SQL claim, heartbeat, finish) costs over Celery's own.",
    "batching": "The same N single-sample inference jobs (each its own `.npy` file, one "
    "`submit_many`) on two stacks whose workers were started with `MXQ_DYNAMIC_BATCHING=1` and "
    "`=0`, other settings at their defaults; jobs/s from the submit to the last job's finish.",
    "writes": "The same prediction rows in the same batches (the worker's flush size, one "
    "transaction each) into the same migrated `predictions` table. Bare SQLite: the `sqlite3` "
    "module's `executemany` on a connection with the pragmas mxq's engine sets (WAL, foreign "
    "keys); bare PostgreSQL: psycopg's `COPY`. Alternating rounds; medians.",
    "training": "LeNet, and a user's own CNN (conv, BatchNorm, dropout: none of mxq's built-ins, "
    "trained by mxq from its registered export with `mxq train --from` and from its code registered "
    "by `mxq arch add`), on tiled scikit-learn "
    "digits, same global batch and epochs, through "
    "`mxq train` and through the data-parallel loop of MXNet's multi-device guide "
    "(`split_and_load`, one `Trainer.step`), run with the cores and threads mxq gives the job, "
    "on 1 and 2 devices. Each side's figure is the median of its epochs' samples/s (the bare "
    "loop runs before and after the job); the whole job's figure is listed below the table.",
    "engines": "For the built-in MLP, LeNet and ResNet-18: one registered version "
    "(exported to ONNX at registration) and one `.npy` input. The bare MXNet loop and the bare ONNX "
    "Runtime loop (read a batch, run, probabilities to NumPy) run in a process pinned to the "
    "worker's cores with its thread limits; then `mxq infer --engine auto` on that worker: its first "
    "job measures both engines and stores the choice; the figure is the next job, which stores its "
    "probabilities in the job's `.npy` (`--output npy`); a third stores SQL rows, for information "
    "(a small model on a fast engine is then bound by the writes). LeNet is trained on the digits "
    "and ResNet-18 briefly on generated images (the MLP keeps random weights); each version gets "
    "int8 and fp16 variants (checked on held-out samples), run bare and by "
    "`mxq infer --precision auto --min-agreement 0.99`: the aim is that job against the best bare "
    "loop the bound allows (a variant only where its agreement meets 0.99); the stored predictions "
    "are compared with MXNet's; FLOPs per sample and the rate against the CPU's peak for the "
    "precision run (float32, or int8) are listed.",
    "fleet": "Simulated device workers (`bench/fleet/devices.py`: threads in a few processes, "
    "nodes of 8 GPUs) run mxq's real worker code (register, heartbeat, consume the device and pool "
    "queues through the Celery app's kombu connection, claim in SQL, leases, progress, throughput "
    "points, outcome, ack); only the computation is a sleep drawn from the job's id. On this "
    "machine's PostgreSQL (a database holding a generated history of jobs) and a Redis server of "
    "the run's own (append-only): the real reconciler every pass, the real API polled as the "
    "dashboard does (every 2 s) with the history queries timed beside it, jobs queued with "
    "`submit_many`, 5 % of the devices killed (SIGKILL) and brought back, one broker SIGKILL and "
    "restart. Claim: a delivery's arrival to its body's start (read, lease check, SQL claim), "
    "judged outside the 15 s after each fault (the p99 with them is shown beside). "
    "Lost: a job neither finished nor waiting in the broker after the devices stopped and a last "
    "reconciler pass; run twice: a job whose work ran to its end twice. The simulation shares this "
    "machine's cores with the servers (its own CPU is listed), and a real worker is a process of "
    "its own with its own database connections (docs/scaling.md).",
    "sharing": "Two CPU devices saturated by a backlog of queued `low` LeNet inference jobs (each "
    "sized to last about the set seconds); a `high` job of one batch submitted at random moments, "
    "its submit-to-start time read from SQL: with the backlog `--no-preemptible` (it waits for a "
    "running job to end), then preemptible (a running job yields at its next flush). Then, per "
    "engine, one `low` job preempted mid-way and resumed, compared sample by sample with an "
    "uninterrupted run of the same job; 'computed twice' is the samples of its throughput points "
    "beyond its own count. Then users of weights 1 and 3 submit many small jobs at once, and a "
    "user with a quota of one device a tenth as many: the weighted users' device-seconds while "
    "both have work waiting, and the capped user's most devices at once.",
    "memory": "The worker's peak resident memory (VmHWM) after an inference job on the input, "
    "then after one on an input 10 times larger: inputs are memory-mapped a batch at a time and "
    "results are flushed as they go, so it should stay flat.",
}


def meminfo_bytes(field: str) -> int | None:
    """A /proc/meminfo figure (`MemTotal`, `MemAvailable`) in bytes; None off Linux."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    total = meminfo_bytes("MemTotal")
    mem = None if total is None else round(total / 2**30, 1)
    mxnet = "not installed"
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower() == "mxnet" or name.lower().startswith("mxnet-"):
            mxnet = f"{dist.version} ({name})"
            break
    return {"host": socket.gethostname(), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)), "cpu_model": model, "memory_gib": mem,
            "mxnet": mxnet, "python": platform.python_version(), "platform": platform.platform(),
            "load_average": list(os.getloadavg())}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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


def _num(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"


def _result(c: dict[str, Any]) -> str:
    if c.get("skipped"):
        return f"skipped: {c['skipped']}"
    return {True: "**pass**", False: "**miss**", None: "—"}[c["pass"]]


def summary_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for case, r in results["cases"].items():
        if r["status"] == "error":
            rows.append([case, "—", "—", "—", "—", "—", f"error: {r['error']}"])
            continue
        for c in r["checks"]:
            rows.append([case, c["check"],
                         f"{c['baseline_label']}: {_num(c['baseline'])} {c['unit']}",
                         f"{c['measured_label']}: {_num(c['measured'])} {c['unit']}",
                         "—" if c["ratio"] is None else f"{c['ratio']:.3f}", c["aim"] or "—",
                         _result(c)])
    return rows


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = ["# mxq benchmark report", "",
             f"- **Date:** {results['date']} (took {results['seconds'] / 60:.1f} min)",
             f"- **Machine:** {m['cores']} cores ({m['usable_cores']} usable by this run), "
             f"{m['cpu_model']}, {m['memory_gib']} GiB memory, host `{m['host']}`",
             f"- **Software:** MXNet {m['mxnet']}, Python {m['python']}, {m['platform']}",
             f"- **Load average** at the start: {', '.join(f'{x:.2f}' for x in m['load_average'])}"
             f"; at the end: {', '.join(f'{x:.2f}' for x in results['load_average_end'])}",
             f"- **Command:** `{results['command']}`", ""]
    if results["quick"]:
        lines += ["> **Quick run:** small sizes to check that every case works. Start-up and "
                  "warm-up dominate, so the ratios below do not judge mxq: run "
                  "`python -m bench` (full sizes) on a quiet machine for that.", ""]
    lines += ["Every ratio is mxq's figure over its baseline, both measured in this run on this "
              "machine; each case runs on a stack of its own (embedded Redis and SQLite in a fresh "
              "home, PostgreSQL in a scratch database).", "", "## Summary", "",
              "| Case | Check | Baseline | mxq | Ratio | Aim | Result |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(row) + " |" for row in summary_rows(results)]
    if results.get("summary_plot"):
        lines += ["", f"![Each check as a share of its aim]({results['summary_plot']})"]
    for case, r in results["cases"].items():
        lines += ["", f"## {TITLES[case]}", "", ABOUT[case], ""]
        if r["status"] == "error":
            lines += [f"**Error:** `{r['error']}` (see the run's output).", ""]
            continue
        lines += [f"Took {r['seconds']:.0f} s. Sizes: {_sizes(r['params'])}.", ""]
        for c in r["checks"]:
            if c.get("skipped"):
                lines.append(f"- {c['check']}: skipped: {c['skipped']}")
                continue
            ratio = "" if c["ratio"] is None else f"; ratio **{c['ratio']:.3f}**"
            aim = f" (aim {c['aim']}: {_result(c)})" if c["aim"] else ""
            note = f" — {c['note']}" if c["note"] else ""
            lines.append(f"- {c['check']}: {c['baseline_label']} {_num(c['baseline'])} {c['unit']}, "
                         f"{c['measured_label']} {_num(c['measured'])} {c['unit']}{ratio}{aim}{note}")
        lines += _details(case, r["result"])
        if r.get("plot"):
            lines += ["", f"![{case}]({r['plot']})"]
    lines += ["", "Raw figures: [results.json](results.json).", ""]
    return "\n".join(lines)


def _sizes(params: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k} {v}"
                     for k, v in params.items())


def figures(values: list[float]) -> str:
    """Measured rates as the report prints them: 12,345, 12,678."""
    return ", ".join(f"{v:,.0f}" for v in values)


def _details(case: str, r: dict[str, Any]) -> list[str]:
    if case == "fleet":
        return fleet_report.details(r)
    if case == "engines":
        peak = r["peak"]
        return [f"- {m['arch']} {tuple(m['shape'])}, {m['samples']:,} samples, batch {m['batch_size']}: "
                f"auto ran {m['engine']} ({m['engine_reason']}); its first job (measuring) "
                f"{m['first_job']:,.0f} samples/s; export max diff {m['onnx'].get('max_diff', 0):.1e}; "
                f"{_trained(m)}precision {m['precision']} ({m['precision_reason']}); "
                + "; ".join(f"{v} agreement {m[v]['agreement']:.2%}, max diff {m[v]['max_diff']:.2g}"
                            for v in ("int8", "fp16"))
                + f" on {m['int8']['held_out']} held-out samples; {m['flops_per_sample'] / 1e6:,.2f} "
                f"MFLOP/sample, {against_peak(m, peak)} ({peak['cores']} cores x "
                f"{peak['ghz']:.2f} GHz x {peak['flops_per_cycle']} FLOP/cycle); cores {m['cores']}"
                f"; {_fixed_costs(m)}"
                for m in r["models"]]
    if case == "objects":
        return [f"- {r['samples']:,} samples ({r['input_mib']:,.0f} MiB), batch {r['batch_size']}; "
                f"runs: local {figures(r['local_runs'])}; S3 {figures(r['s3_runs'])} samples/s"]
    if case == "inference":
        e = r["embedding"]
        return [f"- runs: bare loop {figures(r['bare_runs'])}; mxq "
                f"{figures(r['mxq_runs'])} samples/s; worker cores {r['cores']}",
                f"- embedding: engine {e['engine']} ({e['engine_reason']}); runs: bare loop "
                f"{figures(e['bare_runs'])}; mxq {figures(e['mxq_runs'])} samples/s; "
                f"max |diff| {e['max_abs_diff']:.1e}"]
    if case == "scaling":
        return [f"- input {r['samples']:,} samples, chunk size {r['chunk_size']:,}; worker cores: "
                + "; ".join(f"{d} {c}" for d, c in r["worker_cores"].items()),
                "- runs: " + "; ".join(f"{x['devices']} device(s) {x['samples_per_sec']:,.0f} "
                                        f"(chunks on {', '.join(x['devices_used'])})" for x in r["runs"])]
    if case == "dispatch":
        return [f"- {r['jobs']} jobs each side; submit_many took {r['mxq']['submit_seconds']:.2f} s; "
                f"a probe job's own run p50 {r['mxq']['job_ms_p50']:.1f} ms; cores {r['cores']}",
                f"- latency from {r['latency_jobs']} jobs each, {r['pause_seconds']:g} s apart"]
    if case == "batching":
        return [f"- batching {k}: {r[k]['jobs']} jobs in {r[k]['seconds']:.1f} s, {r[k]['batches']} "
                f"batches, on {', '.join(r[k]['devices'])}" for k in ("on", "off")]
    if case == "writes":
        return [f"- {name}: rounds mxq {figures(r[k]['mxq_runs'])}; bare "
                f"{figures(r[k]['bare_runs'])} rows/s"
                for k, name in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")) if "ratio" in r[k]]
    if case == "training":
        return [f"- {name}, {k} device(s): epochs mxq {figures(d['mxq_epochs'])}; bare "
                f"{figures(d['bare_epochs'])} samples/s; the whole job "
                f"{d['mxq_job']:,.0f} (ratio {d['ratio_job']:.3f}); submit to done with start-up "
                f"{d['mxq_end_to_end']:,.0f} (ratio {d['ratio_end_to_end']:.3f})"
                for name, _, rows in training_cases(r) for k, d in rows.items()]
    if case == "memory":
        return [f"- input {r['input_mib']:,.0f} MiB at 1x, {10 * r['input_mib']:,.0f} MiB at 10x"]
    if case == "sharing":
        delays = {k: ", ".join(f"{d:.2f}" for d in r[k]["delays"]) for k in ("no_preemption", "preemption")}
        return [f"- backlog {r['backlog']} jobs of {r['samples']:,} samples (about {r['job_seconds']:g} s)"
                f"; delays (s) without preemption {delays['no_preemption']}; with {delays['preemption']}"]
    return []


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


def _fixed_costs(m: dict[str, Any]) -> str:
    """An engines case model's fixed costs per job (its result's `fixed_costs`), as a clause."""
    def shown(c: dict[str, Any]) -> str:
        return ", ".join(f"{k.replace('_', ' ')} {'n/a' if v is None else f'{v:.3f}'}"
                         for k, v in c.items())

    costs = m.get("fixed_costs")
    if not costs:
        return "no fixed costs recorded"
    return (f"fixed costs (s): first job (model not cached, engines measured): {shown(costs['first_job'])}"
            f"; fp32 job (model cached): {shown(costs['fp32_job'])}; the --precision auto job: "
            f"{shown(m['precision_fixed_costs'])}, its rate with its start counted "
            f"{m['mxq_precision_from_claim']:,.0f} samples/s")


def against_peak(m: dict[str, Any], peak: dict[str, Any]) -> str:
    """A model's achieved rate beside the peak of the precision it ran in: int8 operations
    against the int8 peak, float32 and float16 (computed in float32 where the CPU has no float16
    kernel) against the float32 one."""
    if m["precision"] == "int8":
        return (f"{m['gflops']:,.1f} G int8 op/s = {m['gflops'] / peak['int8_gops']:.1%} of the int8 "
                f"peak {peak['int8_gops']:,.0f} G op/s ({'VNNI' if peak['vnni'] else 'no VNNI'})")
    return (f"{m['gflops']:,.1f} GFLOP/s = {m['gflops'] / peak['gflops']:.1%} of the float32 peak "
            f"{peak['gflops']:,.0f} GFLOP/s")


def _trained(m: dict[str, Any]) -> str:
    """How an engines case model got its weights, as a clause."""
    if not m.get("trained_on"):
        return "random weights; "
    accuracy = m["val_accuracy"]
    shown = "n/a" if accuracy is None else f"{accuracy:.1%}"
    return (f"trained {m['epochs']} epoch(s) on {m['train_samples']:,} {m['trained_on']} samples "
            f"(validation accuracy {shown}); ")


def write(results: dict[str, Any], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "report.md").write_text(markdown(results))
