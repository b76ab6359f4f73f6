"""Prometheus metrics (names prefixed `mxq_`), computed from SQL at each scrape.

`mxq_broker_up` and `mxq_database_up` (1 or 0) say whether the broker answers a PING and the
database a read: with either down the other numbers would read as an idle, empty stack."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mxq.db.errors import DATABASE_UNAVAILABLE
from mxq.db.reports.history import (
    active_by_owner,
    counts_by_status_and_kind,
    device_rates,
    durations_by_kind,
    pool_depths,
    queued_by_priority,
)
from mxq.db.schema import utcnow
from mxq.json_types import JsonObject, JsonValue
from mxq.workers.broker.health import broker_problem
from mxq.workers.broker.queues import all_pools
from mxq.workers.fleet.device_table import RATE_WINDOW, device_table
from mxq.workers.fleet.gpu_health import listed
from mxq.workers.settings import Settings


class Collector:
    def __init__(self, s: Settings, with_sql: bool = True) -> None:
        self.s, self.with_sql = s, with_sql

    def collect(self) -> Iterator[Metric]:
        broker = GaugeMetricFamily("mxq_broker_up", "1 while the broker answers a PING")
        broker.add_metric([], 0.0 if broker_problem(self.s) else 1.0)
        database = GaugeMetricFamily("mxq_database_up", "1 while the database answers a read")
        try:
            families = list(self._from_sql()) if self.with_sql else []
        except DATABASE_UNAVAILABLE:
            families = []
        database.add_metric([], 1.0 if families else 0.0)
        yield from (broker, database, *families)

    def _from_sql(self) -> Iterator[Metric]:
        url = self.s.database
        yield from _job_families(url)
        devices = device_table(self.s)
        yield from _device_families(devices)
        yield from _nvml_families(devices)
        yield _unplanned_family(devices)
        pools = GaugeMetricFamily("mxq_pool_queue_depth", "Queued jobs per shared pool queue",
                                  labels=["queue"])
        for queue, n in sorted(({q: 0 for q in all_pools()} | pool_depths(url)).items()):
            pools.add_metric([queue], n)
        yield pools


def _job_families(url: str) -> list[Metric]:
    """Jobs by status and kind, per owner and priority; run times; the devices' samples/s."""
    jobs = GaugeMetricFamily("mxq_jobs", "Jobs by status and kind", labels=["status", "kind"])
    # A summary: `_sum` (run time of finished jobs) and `_count` (how many) per kind.
    durations = SummaryMetricFamily("mxq_job_duration_seconds", "Run time of finished jobs by kind",
                                    labels=["kind"])
    rate = GaugeMetricFamily("mxq_device_samples_per_second",
                             "Samples/s per device over the last 5 minutes",
                             labels=DEVICE_LABELS)
    for (status, kind), n in counts_by_status_and_kind(url).items():
        jobs.add_metric([status, kind], n)
    owners = GaugeMetricFamily("mxq_user_jobs", "Queued and running jobs per owner",
                               labels=["owner", "status"])
    for (owner, status), n in sorted(active_by_owner(url).items()):
        owners.add_metric([owner, status], n)
    levels = GaugeMetricFamily("mxq_queued_jobs", "Queued jobs per priority (high is taken "
                               "first)", labels=["priority"])
    for level, n in queued_by_priority(url).items():
        levels.add_metric([level], n)
    for kind, (n, total) in durations_by_kind(url).items():  # every finished job, start to end
        durations.add_metric([kind], count_value=n, sum_value=total)
    for (node, device), per_sec in device_rates(url, utcnow() - RATE_WINDOW).items():
        rate.add_metric([node, device], per_sec)
    return [jobs, owners, levels, durations, rate]


DEVICE_LABELS = ["node", "device"]


def _device_families(rows: list[JsonObject]) -> list[Metric]:
    """Per device (a row of the device table): its queue, health, worker start and memory."""
    depth = GaugeMetricFamily("mxq_queue_depth", "Queued jobs per device queue (also of a "
                              "device with no worker: --allow-offline)", labels=DEVICE_LABELS)
    wait = GaugeMetricFamily("mxq_queue_oldest_wait_seconds", "How long the oldest queued job "
                             "of each device queue has waited", labels=DEVICE_LABELS)
    alive = GaugeMetricFamily("mxq_device_alive", "1 while the device's worker beats",
                              labels=DEVICE_LABELS)
    healthy = GaugeMetricFamily("mxq_device_healthy", "1 while the device's worker beats; 0 "
                                "when it is out (refused: failed its check or faulted) or "
                                "offline", labels=DEVICE_LABELS)
    out_since = GaugeMetricFamily("mxq_device_out_since_seconds", "When a device that is out "
                                  "went out (Unix time); only devices that are out",
                                  labels=DEVICE_LABELS)
    started = GaugeMetricFamily("mxq_worker_start_time_seconds", "When the device's worker "
                                "process started (Unix time): changes() counts restarts",
                                labels=DEVICE_LABELS)
    memory = GaugeMetricFamily("mxq_device_memory_used_bytes", "A GPU's memory in use by any "
                               "process: live from NVML at its worker's heartbeat where NVML is "
                               "read, else as nvidia-smi reported it when its worker was planned",
                               labels=DEVICE_LABELS)
    memory_total = GaugeMetricFamily("mxq_device_memory_total_bytes", "A GPU's memory",
                                     labels=DEVICE_LABELS)
    for d in rows:
        where = [str(d["node"]), str(d["device"])]
        used, total = _number(d.get("memory_used_mib")), _number(d.get("memory_total_mib"))
        if used is not None and total is not None:
            memory.add_metric(where, used * 2.0**20)
            memory_total.add_metric(where, total * 2.0**20)
        depth.add_metric(where, _number(d["queued"]) or 0.0)
        _add(wait, where, _number(d.get("oldest_wait_seconds")))
        alive.add_metric(where, 1.0 if d["alive"] else 0.0)
        healthy.add_metric(where, 1.0 if d["health"] == "healthy" else 0.0)
        if d["health"] == "out":
            _add(out_since, where, _unix_time(d.get("out_since")))
        _add(started, where, _unix_time(d.get("started_at")))
    return [depth, wait, alive, healthy, out_since, memory, memory_total, started]


def _nvml_families(rows: list[JsonObject]) -> list[Metric]:
    """Per GPU whose worker reads NVML (its row's `nvml`, the last reading stored: kept while the
    device is out): NVML's health, why it is bad, ECC, row remaps and clock event reasons."""
    healthy = GaugeMetricFamily("mxq_device_nvml_healthy", "1 while NVML gives no reason to take "
                                "the GPU out, 0 when it does (a critical Xid, a row remap pending, "
                                "uncorrectable ECC errors); GPUs whose worker reads NVML",
                                labels=DEVICE_LABELS)
    fault = GaugeMetricFamily("mxq_device_nvml_fault", "1, labelled with NVML's reason, while "
                              "mxq_device_nvml_healthy is 0", labels=[*DEVICE_LABELS, "reason"])
    ecc = GaugeMetricFamily("mxq_device_ecc_uncorrected_errors", "Uncorrectable ECC errors since "
                            "the driver loaded (NVML, volatile); GPUs with ECC on", labels=DEVICE_LABELS)
    remap = GaugeMetricFamily("mxq_device_row_remap_pending", "1 while a row remap (or, before "
                              "Ampere, a page retirement) waits for a GPU reset", labels=DEVICE_LABELS)
    clocks = GaugeMetricFamily("mxq_device_clock_event_reason", "1 for each reason NVML gives for "
                               "the GPU's clocks being held down now (sw_power_cap, hw_slowdown, "
                               "…)", labels=[*DEVICE_LABELS, "reason"])
    for d in rows:
        read, where = d.get("nvml"), [str(d["node"]), str(d["device"])]
        if not isinstance(read, dict):
            continue
        healthy.add_metric(where, 1.0 if read.get("health") == "ok" else 0.0)
        if read.get("reason"):
            fault.add_metric([*where, str(read["reason"])], 1.0)
        _add(ecc, where, _number(read.get("ecc_uncorrected")))
        pending = read.get("row_remap_pending", read.get("retired_pages_pending"))
        _add(remap, where, None if pending is None else float(bool(pending)))
        for reason in listed(read.get("clock_event_reasons")):
            clocks.add_metric([*where, str(reason)], 1.0)
    return [healthy, fault, ecc, remap, clocks]


def _unplanned_family(rows: list[JsonObject]) -> Metric:
    """1 per GPU the launcher planned no worker for, labelled with why (a short word: the full
    reason is its row's `out_reason`); such a GPU is also `mxq_device_healthy` 0."""
    held = GaugeMetricFamily("mxq_device_unplanned", "1 for a GPU the launcher planned no worker "
                             "for: refused at planning (cause memory_in_use, compute_mode, mig, "
                             "mxnet_build, driver, wheels) or missing from nvidia-smi (missing)",
                             labels=[*DEVICE_LABELS, "cause"])
    for d in rows:
        if d.get("unplanned") and d["health"] == "out":
            held.add_metric([str(d["node"]), str(d["device"]), str(d["unplanned"])], 1.0)
    return held


def _add(family: GaugeMetricFamily, where: list[str], value: float | None) -> None:
    """A device's sample, when it has one."""
    if value is not None:
        family.add_metric(where, value)


def _number(value: JsonValue) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _unix_time(value: JsonValue) -> float | None:
    """An ISO time of the device table (None or empty: none) as Unix time."""
    return datetime.fromisoformat(value).timestamp() if isinstance(value, str) and value else None


def render_metrics(s: Settings, with_sql: bool = True) -> tuple[bytes, str]:
    """The exposition; without `with_sql`, only `mxq_broker_up` and `mxq_database_up` (0), which
    name no one: what a scrape gets while the database is down and cannot say who asks."""
    registry = CollectorRegistry()
    registry.register(Collector(s, with_sql))
    return generate_latest(registry), CONTENT_TYPE_LATEST
