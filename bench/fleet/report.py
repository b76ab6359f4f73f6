"""The fleet case's part of the bench report: its checks (each figure against its aim, per fleet
size), its plot (each figure against the number of devices) and its detail lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (figure, label, unit, aim: the figure at 1,000 devices must stay at or below it)
AIMED = [("claim_p99_ms", "claim p99", "ms", 50.0),
         ("reconcile_pass_s", "reconciler pass, loaded", "s", 5.0),
         ("api_jobs_p95_ms", "API /jobs p95", "ms", 100.0),
         ("api_devices_p95_ms", "API /devices p95", "ms", 100.0),
         ("history_p95_ms", "history queries p95", "ms", 100.0)]


def checks(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for the report: every aimed figure of every fleet size (judged at the largest size,
    shown for the others), then lost and duplicated jobs (0 everywhere)."""
    rows = []
    largest = max(int(n) for n in r["by_devices"])
    for n, f in r["by_devices"].items():
        for key, label, unit, aim in AIMED:
            judged = int(n) == largest
            rows.append({"check": f"{label}, {n} devices", "unit": unit, "baseline_label": "aim",
                         "baseline": aim, "measured_label": "measured", "measured": f[key],
                         "ratio": f[key] / aim if judged else None,
                         "aim": "<= 1" if judged else None,
                         "pass": f[key] <= aim if judged else None,
                         "note": "" if judged else "for information: aims are for the largest fleet"})
        rows.append({"check": f"jobs lost / run twice, {n} devices", "unit": "jobs",
                     "baseline_label": "aim", "baseline": 0, "measured_label": "lost",
                     "measured": f["lost"], "ratio": None, "aim": "= 0",
                     "pass": f["lost"] == 0 and f["duplicated"] == 0,
                     "note": f"run twice: {f['duplicated']}"})
    return rows


def plot(r: dict[str, Any], out: Path, plt: Any) -> str:
    """Six panels, each a figure against the number of devices (log scale)."""
    sizes = sorted(r["by_devices"], key=int)
    xs = [int(n) for n in sizes]
    f = [r["by_devices"][n] for n in sizes]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    panels = [
        ("claim (delivery to body), ms", {"p50": [x["claim_p50_ms"] for x in f],
                                          "p99": [x["claim_p99_ms"] for x in f],
                                          "p99 with the faults":
                                              [x["claim_p99_with_faults_ms"] for x in f]}, 50.0),
        ("writes and claims per second", {"worker beats": [x["worker_beats_per_s"] for x in f],
                                          "job beats": [x["job_beats_per_s"] for x in f],
                                          "metric points": [x["metric_writes_per_s"] for x in f],
                                          "claims": [x["claims_per_s"] for x in f]}, None),
        ("CPU cores used", {"PostgreSQL": [x["pg_cpu_cores"] for x in f],
                            "simulated devices": [x["sim_cpu_cores"] for x in f]}, None),
        ("reconciler pass, s", {"max while loaded": [x["reconcile_pass_s"] for x in f]}, 5.0),
        ("API and history p95, ms", {"/jobs": [x["api_jobs_p95_ms"] for x in f],
                                     "/devices": [x["api_devices_p95_ms"] for x in f],
                                     f"history ({r['history_jobs']:,} jobs)":
                                         [x["history_p95_ms"] for x in f]}, 100.0),
        ("Redis bytes per queued job", {"bytes": [x["redis_bytes_per_queued_job"] for x in f]}, None),
    ]
    for ax, (title, series, aim) in zip(axes.flat, panels, strict=True):
        for name, values in series.items():
            ax.plot(xs, values, marker="o", label=name)
        if aim is not None:
            ax.axhline(aim, ls=":", color="#d62728", lw=1, label=f"aim {aim:g}")
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("simulated devices")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fleet.png", dpi=110)
    plt.close(fig)
    return "fleet.png"


def details(r: dict[str, Any]) -> list[str]:
    lines = [f"- history behind the API and the queries: {r['history_jobs']:,} generated jobs; "
             f"work times scaled by {r['scale']:g}", "",
             "| devices | jobs | claims/s | claim p50 / p99 ms (p99 with faults) "
             "| idle submit→claim p50 / p99 ms "
             "| beats/s (worker, job) | metric points/s | PostgreSQL cores | sim cores "
             "| reconciler pass s | /jobs, /devices p95 ms | history p95 ms | Redis B/job "
             "| lost | twice |",
             "|" + " --- |" * 15]
    for n, f in sorted(r["by_devices"].items(), key=lambda kv: int(kv[0])):
        idle = f["idle_submit_to_claim_ms"]
        lines.append(
            f"| {n} | {f['jobs']:,} | {f['claims_per_s']:.1f} | {f['claim_p50_ms']:.1f} / "
            f"{f['claim_p99_ms']:.1f} ({f['claim_p99_with_faults_ms']:.0f}) | "
            f"{idle['p50']:.0f} / {idle['p99']:.0f} | "
            f"{f['worker_beats_per_s']:.0f}, {f['job_beats_per_s']:.0f} | {f['metric_writes_per_s']:.1f} | "
            f"{f['pg_cpu_cores']:.2f} | {f['sim_cpu_cores']:.2f} | {f['reconcile_pass_s']:.2f} | "
            f"{f['api_jobs_p95_ms']:.0f}, {f['api_devices_p95_ms']:.0f} | {f['history_p95_ms']:.0f} | "
            f"{f['redis_bytes_per_queued_job']:.0f} | {f['lost']} | {f['duplicated']} |")
    for n, f in sorted(r["by_devices"].items(), key=lambda kv: int(kv[0])):
        queries = ", ".join(f"{q} {ms:.0f}" for q, ms in f["history_queries_p95_ms"].items())
        lines += ["", f"- {n} devices: faults {'; '.join(f['faults'])}; statuses {f['statuses']}; "
                  f"live heartbeats' age p99 {f['heartbeat_age_p99_s']:.1f} s; "
                  f"reruns after a kill {f['rerun_after_kill']}; "
                  f"submit_many {f['submit_jobs_per_s']:,.0f} jobs/s; counters {f['counters']}",
                  f"- {n} devices, history p95 (ms) by query: {queries}"]
    return lines
