"""The benchmark report's Markdown: the machine, the summary of every case's checks
(`bench.report.checks`), and each case's title, what it measures and its details."""

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
from bench.report.checks import against_peak, training_cases

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
        return [f"- {m['arch']} {tuple(m['shape'])}, {m['samples']:,} samples (float32 loops and jobs; "
                f"{m['precision_samples']:,} for the variants' and the precision job), "
                f"batch {m['batch_size']}: "
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
