"""The benchmark report's PNG plots: one per case (`plot_case`), and the summary of every case's
ratio against its aim (`plot_summary`). matplotlib is imported only when a plot is drawn."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from bench.fleet import report as fleet_report
from bench.report.checks import AIMS, WEBHOOK_FLOOR, training_cases

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _plt() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Axes, labels: list[str], values: list[float], unit: str,
          colors: list[str] | None = None) -> None:
    bars = ax.bar(labels, values, color=colors or ["#999999", "#1f77b4", "#6baed6", "#2ca02c"][:len(values)])
    for b, v in zip(bars, values, strict=True):
        ax.annotate(f"{v:,.1f}" if v < 100 else f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(unit)
    ax.margins(y=0.15)


def _grouped(ax: Axes, groups: list[str], series: dict[str, list[float]], unit: str) -> None:
    import numpy as np

    width = 0.8 / len(series)
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name,
                      color=["#999999", "#1f77b4", "#2ca02c"][i % 3])
        for b, v in zip(bars, values, strict=True):
            if v:
                ax.annotate(f"{v:,.0f}" if v >= 100 else f"{v:,.1f}",
                            (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, groups)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)


def plot_case(case: str, r: dict[str, Any], out: Path) -> str:
    """One PNG for a case's figures; its file name (relative to `out`)."""
    plt = _plt()
    name = f"{case}.png"
    if case == "fleet":
        return fleet_report.plot(r, out, plt)
    if case == "sharing":
        fig, a = plt.subplots(figsize=(6, 3.6))
        _grouped(a, ["p50", "p95"], {"no preemption": [r["no_preemption"]["p50"], r["no_preemption"]["p95"]],
                                     "preemption": [r["preemption"]["p50"], r["preemption"]["p95"]]}, "s")
        a.set_title(f"urgent job's submit to start, {r['tries']} tries", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        return name
    if case == "dispatch":
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
        _bars(a, ["bare Celery\nno-op", "mxq\nprobe"], [r["bare"]["tasks_per_sec"],
                                                        r["mxq"]["jobs_per_sec"]], "jobs/s")
        a.set_title(f"throughput ({r['jobs']} jobs)", fontsize=10)
        _grouped(b, ["p50", "p95"], {"bare Celery": [r["bare_latency_ms"]["p50"],
                                                     r["bare_latency_ms"]["p95"]],
                                     "mxq": [r["latency_ms"]["p50"], r["latency_ms"]["p95"]]}, "ms")
        b.set_title("submit-to-start latency, idle worker", fontsize=10)
    else:
        fig, a = plt.subplots(figsize=(6, 3.6))
        _single_axis(a, case, r)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _single_axis(a: Axes, case: str, r: dict[str, Any]) -> None:
    """The plot of a case drawn on one axis."""
    if case == "engines":
        _grouped(a, [m["arch"] for m in r["models"]],
                 {"bare MXNet": [m["bare"]["mxnet"] for m in r["models"]],
                  "bare ONNX Runtime": [m["bare"]["onnx"] for m in r["models"]],
                  "bare int8": [m["bare"]["int8"] for m in r["models"]],
                  "bare fp16": [m["bare"]["fp16"] for m in r["models"]],
                  "mxq auto (.npy)": [m["mxq_auto"] for m in r["models"]],
                  "mxq --precision auto": [m["mxq_precision"] for m in r["models"]],
                  "mxq auto (SQL rows)": [m["mxq_auto_sql"] for m in r["models"]]}, "samples/s")
        a.set_yscale("log")
        a.set_title("one CPU device, results stored", fontsize=10)
    elif case == "objects":
        _bars(a, ["local .npy", "s3:// .npy"], [r["local"], r["s3"]], "samples/s")
        a.set_title(f"{r['arch']}, {r['samples']:,} samples, batch {r['batch_size']}", fontsize=10)
    elif case == "inference":
        _bars(a, ["bare MXNet", "mxq infer\n(job)", "mxq infer\n(submit..done)",
                  "bare\nembedding", "mxq infer\nembedding"],
              [r["bare"], r["mxq"], r["mxq_end_to_end"], r["embedding"]["bare"],
               r["embedding"]["mxq"]], "samples/s",
              ["#999999", "#1f77b4", "#6baed6", "#999999", "#1f77b4"])
        a.set_title(f"{r['arch']} and a {r['embedding']['width']}-d embedding, {r['samples']:,} "
                    f"samples, batch {r['batch_size']}", fontsize=10)
    elif case == "scaling":
        _bars(a, ["1 device", "2 devices"], [r["one_device"], r["two_devices"]], "samples/s")
        a.axhline(2 * r["one_device"], ls="--", color="#d62728", lw=1, label="ideal 2x")
        a.axhline(AIMS["scaling"][1] * r["one_device"], ls=":", color="#ff7f0e", lw=1,
                  label=f"aim {AIMS['scaling'][1]:g}x")
        a.legend(fontsize=8)
        a.set_title(f"one job of {r['samples']:,} samples in 2 chunks", fontsize=10)
    elif case == "batching":
        _bars(a, ["batching off", "batching on"], [r["off"]["jobs_per_sec"],
                                                   r["on"]["jobs_per_sec"]], "jobs/s")
        a.set_title(f"{r['jobs']} single-sample inference jobs", fontsize=10)
    elif case == "writes":
        groups = [n for k, n in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")) if "ratio" in r[k]]
        keys = [k for k in ("sqlite", "postgresql") if "ratio" in r[k]]
        _grouped(a, groups, {"bare bulk insert": [r[k]["bare"] for k in keys],
                             "predictions.write": [r[k]["mxq"] for k in keys]}, "rows/s")
        a.set_title(f"{r['rows']:,} rows in batches of {r['batch']:,}", fontsize=10)
    elif case == "sqlrows":
        keys = [k for k in ("sqlite", "postgresql") if "ratio" in r[k]]
        _grouped(a, [{"sqlite": "SQLite", "postgresql": "PostgreSQL"}[k] for k in keys],
                 {"--output npy": [r[k]["npy"] for k in keys],
                  "--output db": [r[k]["db"] for k in keys]}, "samples/s")
        a.set_title(f"MLP, {r['samples']:,} samples, batch {r['batch_size']}", fontsize=10)
    elif case == "training":
        rows = [(f"{name}, {k} dev", d) for name, _, cases in training_cases(r)
                for k, d in cases.items()]
        _grouped(a, [label for label, _ in rows],
                 {"bare loop": [d["bare"] for _, d in rows],
                  "mxq train": [d["mxq"] for _, d in rows]}, "samples/s")
        a.set_title(f"{r['samples']:,} samples x {r['epochs']} epochs", fontsize=10)
    elif case == "webhooks":
        _bars(a, ["bare POSTs", "mxq sender"], [r["bare"], r["mxq"]], "deliveries/s")
        a.axhline(WEBHOOK_FLOOR, ls=":", color="#ff7f0e", lw=1, label=f"aim {WEBHOOK_FLOOR:g}/s")
        a.legend(fontsize=8)
        a.set_title(f"{r['deliveries']:,} deliveries, {r['senders']} threads", fontsize=10)
    elif case == "memory":
        _bars(a, ["1x input", "10x input"], [r["peak_rss_1x_mib"], r["peak_rss_10x_mib"]],
              "peak RSS (MiB)")
        a.axhline(AIMS["memory"][1] * r["peak_rss_1x_mib"], ls=":", color="#ff7f0e", lw=1,
                  label="aim: 1x + 10%")
        a.legend(fontsize=8, loc="lower right")
        a.set_title(f"worker peak RSS, {r['samples']:,} vs {r['samples_10x']:,} samples",
                    fontsize=10)


def plot_summary(results: dict[str, Any], out: Path) -> str | None:
    """Each check with an aim as a share of it (at least 1 = aim met); its file name."""
    rows = [(f"{case}: {c['check']}", c) for case, r in results["cases"].items()
            for c in r.get("checks", []) if c["aim"] and c["ratio"] is not None]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    shares = []
    for _, c in rows:
        op, aim = c["aim"].split()
        # (a figure of 0 under an at-most aim, such as samples computed twice, is drawn at 10x)
        shares.append(c["ratio"] / float(aim) if op == ">=" else
                      min(10.0, float(aim) / c["ratio"]) if c["ratio"] > 0 else 10.0)
    labels = [f"{name}  ({c['ratio']:.2f}, aim {c['aim']})" for name, c in rows]
    colors = ["#2ca02c" if c["pass"] else "#d62728" for _, c in rows]
    ax.barh(labels[::-1], shares[::-1], color=colors[::-1])
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("measured as a share of the aim (1 or more: aim met)")
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "summary.png", dpi=110)
    plt.close(fig)
    return "summary.png"


# ---------------------------------------------------------------- markdown
