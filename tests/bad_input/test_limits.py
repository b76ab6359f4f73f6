"""Limits that limit (issue 29, item 6): CPU devices bounded by the machine, probes bounded by a
FLOP budget, a schedule that does not pile fires on a training still running, and jobs queued
for a device without a worker visible in `mxq devices` and `/metrics`."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from pydantic import ValidationError

from mxq.api.metrics import render_metrics
from mxq.api.schemas import DeviceRecord
from mxq.db import jobs, schedules
from mxq.db.reports.history import require_job
from mxq.errors import JobRejected
from mxq.workers.fleet.device_table import device_table
from mxq.workers.hardware.devices import discover
from mxq.workers.jobs.jobspecs import ParamsError, ProbeParams, probe_flops, validate, validated
from mxq.workers.schedules.fires import run_now, tick
from mxq.workers.settings import DEFAULT_MAX_PROBE_GFLOP, Settings, usable_cores
from tests.conftest import NODE, Stack, run_cli
from tests.support.schedules import T0, add_retraining, fresh_dataset


def test_cpu_devices_are_bounded_by_the_cores_unless_raised() -> None:
    too_many = max(usable_cores(), 2) + 1
    with pytest.raises(ValidationError, match=f"MXQ_CPU_DEVICES={too_many}: at most .*set "
                                              "MXQ_MAX_CPU_DEVICES"):
        Settings(cpu_devices=too_many)
    raised = Settings(cpu_devices=too_many, max_cpu_devices=too_many)
    assert len(discover("no-such-nvidia-smi", raised.cpu_devices)) == too_many
    assert Settings(cpu_devices=2).cpu_devices == 2  # the default fits any machine


def test_probes_are_bounded_by_a_flop_budget() -> None:
    assert probe_flops(1024, 32, 5) / 1e9 < DEFAULT_MAX_PROBE_GFLOP  # the default probe fits
    assert validated(ProbeParams, {}, Settings(max_probe_gflop=DEFAULT_MAX_PROBE_GFLOP).limits).size == 1024
    with pytest.raises(ParamsError, match=r"size=16384, batch=32, repeat=10000 is 87,970,859 "
                                          r"GFLOP of work; at most 100 GFLOP \(MXQ_MAX_PROBE_GFLOP\)"):
        validate("probe", {"size": 16384, "repeat": 10000}, Settings(max_probe_gflop=100).limits)
    big = {"size": 4096, "repeat": 1}  # 275 GFLOP: refused by default, allowed when raised
    with pytest.raises(ParamsError, match="275 GFLOP"):
        validate("probe", big, Settings(max_probe_gflop=100).limits)
    assert validated(ProbeParams, big, Settings(max_probe_gflop=300).limits).size == 4096


def test_a_probe_over_the_budget_is_refused_at_submit(isolated: Stack) -> None:
    from mxq.workers.jobs.submit import submit

    s = isolated.settings.model_copy(update={"max_probe_gflop": DEFAULT_MAX_PROBE_GFLOP})
    with pytest.raises(JobRejected, match="MXQ_MAX_PROBE_GFLOP") as caught:
        submit(s, "probe", {"size": 16384, "repeat": 10000}, "cpu:0", allow_offline=True)
    assert require_job(s.database, caught.value.job_id)["status"] == "failed"


def test_a_schedule_skips_fires_while_its_last_training_runs(isolated: Stack) -> None:
    """An every-minute schedule whose training takes longer: one job at a time, each fire in
    between recorded as skipped (naming the job still running), none queued behind it."""
    s, db = isolated.settings, isolated.settings.database
    fresh_dataset(isolated)
    add_retraining(isolated, "minutely", "* * * * *")
    for minute in (1, 2, 3):
        tick(s, T0 + timedelta(minutes=minute, seconds=5))
    first, *skipped = schedules.fires(db, "minutely")
    assert first["job_status"] == "queued" and len(skipped) == 2
    for fire in skipped:
        assert fire["job_id"] is None and fire["job_status"] == "skipped"
        assert f"the previous fire's job {first['job_id']} " in (fire["error"] or "")
    manual = run_now(s, "minutely", T0 + timedelta(minutes=3, seconds=30))  # a person's ask runs
    manual_job = next(f for f in schedules.fires(db, "minutely") if f["manual"])["job_id"]
    assert first["job_id"] is not None and manual_job is not None
    jobs.cancel(db, first["job_id"])
    jobs.cancel(db, manual_job)
    tick(s, T0 + timedelta(minutes=4, seconds=5))  # the trainings ended: the next fire runs
    fires = schedules.fires(db, "minutely")
    assert manual and fires[-1]["job_status"] == "queued" and fires[-1]["job_id"] is not None
    assert [f["job_id"] is not None for f in fires] == [True, False, False, True, True]


def test_jobs_for_a_device_without_a_worker_are_visible(isolated: Stack) -> None:
    """`--allow-offline` jobs for a device that never started: a row of their own in the device
    table (CLI and API), and their queue depth and wait in /metrics."""
    from mxq.workers.jobs.submit import submit

    s = isolated.settings
    ids = [submit(s, "probe", {"size": 16, "batch": 1, "repeat": 1}, "cpu:7", allow_offline=True)
           for _ in range(2)]
    row = next(r for r in device_table(s) if r["device"] == "cpu:7")
    assert row["offline"] and not row["alive"] and row["queued"] == 2 and row["node"] == NODE
    waited = row["oldest_wait_seconds"]
    assert row["worker"] == f"cpu7@{NODE}" and isinstance(waited, float) and waited >= 0
    assert (row["health"], row["out_reason"], row["out_since"]) == ("offline", None, None)
    DeviceRecord.model_validate(row)  # what GET /api/v1/devices answers with
    shown = run_cli(["devices", "--json"], isolated.env)
    assert shown.returncode == 0, shown.stderr
    assert [r["queued"] for r in json.loads(shown.stdout) if r["device"] == "cpu:7"] == [2]
    text = render_metrics(s)[0].decode()
    assert f'mxq_queue_depth{{device="cpu:7",node="{NODE}"}} 2.0' in text
    assert f'mxq_queue_oldest_wait_seconds{{device="cpu:7",node="{NODE}"}}' in text
    for job_id in ids:
        jobs.cancel(s.database, job_id)
    assert not any(r["device"] == "cpu:7" for r in device_table(s))  # nothing waits: no row
