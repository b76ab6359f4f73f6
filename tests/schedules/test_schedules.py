"""The schedule tick with a controllable clock, against a real database and broker (no workers:
what it queues stays queued)."""

from __future__ import annotations

import multiprocessing
import os
from datetime import datetime, timedelta
from multiprocessing.synchronize import Barrier

import pytest

from mxq.db import registry, schedules
from mxq.db.reports.history import require_job
from mxq.workers.jobs.jobspecs import ParamsError
from mxq.workers.schedules.fires import add_schedule, run_now, tick
from tests.conftest import Stack
from tests.support.schedules import RETRAINING, T0, add_retraining, fresh_dataset

pytestmark = pytest.mark.both_legs

def test_fires_at_local_times_across_dst(isolated: Stack) -> None:
    fresh_dataset(isolated)
    add_retraining(isolated, "berlin", "30 2 * * *", "Europe/Berlin")
    now = T0
    while now < T0 + timedelta(days=4):
        tick(isolated.settings, now)
        now += timedelta(minutes=30)
    fires = schedules.fires(isolated.settings.database, "berlin")
    assert [f["fire_time"] for f in fires] == [
        "2026-03-28T01:30:00+00:00", "2026-03-29T01:30:00+00:00",  # CET, then just after the gap
        "2026-03-30T00:30:00+00:00", "2026-03-31T00:30:00+00:00"]  # CEST
    assert not any(f["missed"] for f in fires) and fires[0]["job_status"] == "queued"
    # No worker runs the first training: each later fire is skipped while it is still queued.
    assert all(f["job_status"] == "skipped" for f in fires[1:])
    assert fires[0]["job_id"] is not None
    job = require_job(isolated.settings.database, fires[0]["job_id"], with_metrics=True)
    assert job["kind"] == "train" and job["params"]["fire_id"] and job["schedule"] is not None
    assert job["schedule"]["schedule"] == "berlin"
    assert job["schedule"]["fire_time"] == fires[0]["fire_time"]


def _race(env: dict, now: datetime, barrier: Barrier, out: multiprocessing.Queue) -> None:
    os.environ.update(env)
    from mxq.workers.settings import Settings

    barrier.wait()
    out.put(len(tick(Settings(), now)))


def test_two_racing_ticks_fire_each_schedule_once(isolated: Stack) -> None:
    fresh_dataset(isolated)
    for i in range(10):
        add_retraining(isolated, f"s{i}", "0 * * * *")
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    at = T0 + timedelta(hours=1, minutes=5)
    procs = [ctx.Process(target=_race, args=(isolated.env, at, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    made = sorted(out.get(timeout=5) for _ in procs)
    assert sum(made) == 10, made
    for i in range(10):
        fires = schedules.fires(isolated.settings.database, f"s{i}")
        assert len(fires) == 1 and fires[0]["job_id"] is not None


def test_three_day_outage_runs_one_catch_up(isolated: Stack) -> None:
    fresh_dataset(isolated)
    add_retraining(isolated, "daily", "0 3 * * *")
    # Down from before the first fire (28th 03:00) until the 31st 02:00: three fires missed.
    tick(isolated.settings, T0 + timedelta(days=3, hours=14))
    tick(isolated.settings, T0 + timedelta(days=3, hours=14, minutes=1))
    fires = schedules.fires(isolated.settings.database, "daily")
    assert len(fires) == 1
    assert fires[0]["fire_time"] == "2026-03-30T03:00:00+00:00"
    assert fires[0]["catch_up"] and fires[0]["missed"] == 2  # 28th and 29th collapsed into it
    assert fires[0]["job_status"] == "queued"  # one catch-up job
    assert schedules.get(isolated.settings.database, "daily")["next_fire_at"] == \
        "2026-03-31T03:00:00+00:00"


def test_run_now_fires_once_at_once(isolated: Stack) -> None:
    fresh_dataset(isolated)
    before = add_retraining(isolated, "manual", "0 3 1 1 *")
    run_now(isolated.settings, "manual", T0 + timedelta(minutes=1))
    tick(isolated.settings, T0 + timedelta(minutes=2))  # not due: nothing more
    fires = schedules.fires(isolated.settings.database, "manual")
    assert len(fires) == 1 and fires[0]["manual"] and fires[0]["job_status"] == "queued"
    assert schedules.get(isolated.settings.database, "manual")["next_fire_at"] == before["next_fire_at"]


def test_newest_file_is_used_and_an_empty_glob_fails_only_that_fire(isolated: Stack) -> None:
    add_retraining(isolated, "fresh", "0 * * * *")
    tick(isolated.settings, T0 + timedelta(hours=1))
    fresh_dataset(isolated, "fresh/old.npz", age=3600)
    fresh_dataset(isolated, "fresh/new.npz")
    tick(isolated.settings, T0 + timedelta(hours=2))
    failed, ok = schedules.fires(isolated.settings.database, "fresh")
    assert failed["job_id"] is None and failed["job_status"] == "failed"
    assert failed["error"] is not None and "matches no file" in failed["error"]
    assert "fresh/*.npz" in failed["error"]
    assert ok["dataset_file"] is not None and ok["dataset_file"].endswith("fresh/new.npz")
    assert ok["job_status"] == "queued"


def test_paused_schedules_do_not_fire(isolated: Stack) -> None:
    fresh_dataset(isolated)
    add_retraining(isolated, "paused", "0 * * * *")
    schedules.set_enabled(isolated.settings.database, "paused", False)
    assert tick(isolated.settings, T0 + timedelta(hours=5)) == []


@pytest.mark.parametrize("args, needle", [
    (["--cron", "61 * * * *"], "invalid cron expression '61 * * * *'"),
    (["--cron", "0 3 * * *", "--tz", "Nowhere/City"], "unknown time zone 'Nowhere/City'"),
    (["--cron", "0 3 * * *", "--arch", "vgg"], "unknown architecture 'vgg'; known: mlp, lenet"),
    (["--cron", "0 3 * * *", "--promote", "sometimes"], "--promote 'sometimes'"),
])
def test_bad_schedules_are_refused(isolated: Stack, args: list[str], needle: str) -> None:
    base = {"--arch": "mlp", "--dataset": "fresh/*.npz", "--model": "m"}
    for i, a in enumerate(args[::2]):
        base[a] = args[2 * i + 1]
    flat = [x for kv in base.items() for x in kv]
    proc = isolated.mxq("schedule", "add", "bad", *flat)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert schedules.list_schedules(isolated.settings.database) == []


def test_a_schedule_name_with_control_characters_is_refused(isolated: Stack) -> None:
    """A name of any characters was stored (Schemathesis stored one with a newline and a NUL,
    which its later calls then could not name in a URL): names follow mxq's one rule."""
    fresh_dataset(isolated)
    proc = isolated.mxq("schedule", "add", "night\nly", "--cron", "0 3 * * *", "--arch", "mlp",
                        "--dataset", "fresh/*.npz", "--model", "m")
    assert proc.returncode == 2 and "schedule name 'night\\nly' is not allowed" in proc.stderr, proc.stderr
    assert schedules.list_schedules(isolated.settings.database) == []


def test_removing_a_schedule_keeps_the_history_of_its_jobs(isolated: Stack) -> None:
    url = isolated.settings.database
    fresh_dataset(isolated)
    add_retraining(isolated, "gone", "0 3 * * *")
    fire_id = run_now(isolated.settings, "gone", T0)
    job_id = schedules.fires(url, "gone")[0]["job_id"]
    assert job_id is not None
    schedules.remove(url, "gone")
    described = require_job(url, job_id, with_metrics=True)  # crashed before: the fire went with it
    assert described["schedule"] == {"schedule": "gone", "fire_time": T0.isoformat(),
                                     "promote": "if-better", "metric": "val_accuracy",
                                     "min_gain": 0.0, "min_metric": None, "removed": True}
    shown = isolated.mxq("job", str(job_id), "--json")
    assert shown.returncode == 0, shown.stderr
    # A fire still training when its schedule goes decides by the policy it was fired with.
    registry.add_model(url, {"name": "retrained-gone", "version": 1, "arch": "mlp", "input_shape": [4],
                             "classes": 3, "params_file": "p", "symbol_file": "s", "checksum": "0" * 64,
                             "source": "test"})
    decision = schedules.decide_promotion(url, fire_id, "retrained-gone", 1, {"val_accuracy": 0.5})
    assert decision["decision"] == "promoted" and decision["metric"] == "val_accuracy"
    add_retraining(isolated, "newer", "0 4 * * *")  # a new schedule never inherits the old one's fires
    assert schedules.fires(url, "newer") == []
    fired_by = require_job(url, job_id, with_metrics=True)["schedule"]
    assert fired_by is not None and fired_by["schedule"] == "gone"


def test_a_fire_below_the_promotion_floor_registers_and_is_not_promoted(isolated: Stack) -> None:
    """`--min-metric`: a retraining fed the wrong data ended at val_accuracy 0.084 and `if-better`
    promoted it, nothing being promoted yet; below the floor it is kept, and says why. A fire
    above the floor is promoted as the policy says."""
    s, url = isolated.settings, isolated.settings.database
    fresh_dataset(isolated)
    record = add_schedule(s, "floored", "0 3 * * *", "UTC", "fresh/*.npz",
                          {**RETRAINING, "name": "floored"}, "if-better", "val_accuracy", 0.0,
                          now=T0, min_metric=0.5)
    assert record["min_metric"] == 0.5 and schedules.get(url, "floored")["min_metric"] == 0.5
    for version in (1, 2):
        registry.add_model(url, {"name": "floored", "version": version, "arch": "mlp",
                                 "input_shape": [4], "classes": 3, "params_file": "p",
                                 "symbol_file": "s", "checksum": "0" * 64, "source": "test"})
    low = run_now(s, "floored", T0)
    kept = schedules.decide_promotion(url, low, "floored", 1, {"val_accuracy": 0.084})
    assert (kept["decision"], kept["reason"]) == (
        "kept", "val_accuracy 0.0840 is below the floor 0.5 (--min-metric)")
    assert not any(m["promoted"] for m in registry.list_models(url, "floored"))  # registered, kept
    high = run_now(s, "floored", T0 + timedelta(minutes=1))
    assert schedules.decide_promotion(url, high, "floored", 2, {"val_accuracy": 0.9})["decision"] == \
        "promoted"
    for version, figure in ((3, 0.95), (4, 0.8), (5, 0.8)):
        registry.add_model(url, {"name": "floored", "version": version, "arch": "mlp",
                                 "input_shape": [4], "classes": 3, "params_file": "p",
                                 "symbol_file": "s", "checksum": "0" * 64, "source": "test",
                                 "metrics": {"val_accuracy": figure}})
    registry.promote(url, "floored", 3)  # registered at 0.95, on another night's data
    stored = schedules.decide_promotion(url, run_now(s, "floored", T0 + timedelta(minutes=2)),
                                        "floored", 4, {"val_accuracy": 0.8}, (2, {"val_accuracy": 0.7}))
    assert (stored["decision"], stored["promoted_value"], stored["promoted_value_from"]) == (
        "kept", 0.95, "its registration")  # measured again, but as another version: not used
    fair = schedules.decide_promotion(url, run_now(s, "floored", T0 + timedelta(minutes=3)),
                                      "floored", 5, {"val_accuracy": 0.8}, (3, {"val_accuracy": 0.7}))
    assert (fair["decision"], fair["promoted_value"], fair["promoted_value_from"]) == (
        "promoted", 0.7, "this validation split")  # 3 on this split: 0.7
    with pytest.raises(ParamsError, match="--min-metric nan: give a finite number"):
        add_schedule(s, "nan-floor", "0 3 * * *", "UTC", "fresh/*.npz", dict(RETRAINING),
                     "if-better", "val_accuracy", 0.0, now=T0, min_metric=float("nan"))


def test_a_clock_jump_forward_and_back_fires_once_then_on_its_times(isolated: Stack) -> None:
    """A day ahead, then right again: one catch-up fire for the day, then fires at the cron times
    of the real clock (not none for a day), and no fire time twice when the clock reaches it."""
    fresh_dataset(isolated)
    add_retraining(isolated, "five", "*/5 * * * *")
    db, at = isolated.settings.database, lambda **d: T0 + timedelta(**d)
    tick(isolated.settings, at(minutes=6))  # 12:05
    tick(isolated.settings, at(days=1, minutes=6))  # the clock a day ahead: one catch-up
    tick(isolated.settings, at(minutes=11))  # the clock right again: nothing due at 12:11
    assert schedules.get(db, "five")["next_fire_at"] == "2026-03-27T12:15:00+00:00"
    tick(isolated.settings, at(minutes=16))  # 12:15 fires: not suppressed for a day
    tick(isolated.settings, at(days=1, minutes=6))  # the real clock reaches the jumped fire time
    tick(isolated.settings, at(days=1, minutes=11))
    fires = schedules.fires(db, "five")
    assert sorted((f["fire_time"], f["missed"]) for f in fires) == [
        ("2026-03-27T12:05:00+00:00", 0), ("2026-03-27T12:15:00+00:00", 0),
        ("2026-03-28T12:05:00+00:00", 287), ("2026-03-28T12:10:00+00:00", 0)]


def test_a_schedule_trains_on_the_built_in_digits(isolated: Stack) -> None:
    """`--dataset digits`, as `mxq train` takes it: added, and its fire submits a training on it
    (every fire failed "matches no file" while the schedule was accepted)."""
    add_retraining(isolated, "digits", "0 3 1 1 *", dataset="digits")
    run_now(isolated.settings, "digits", T0 + timedelta(minutes=1))
    fire = schedules.fires(isolated.settings.database, "digits")[0]
    assert fire["error"] is None and fire["job_id"] is not None, fire
    assert require_job(isolated.settings.database, fire["job_id"])["params"]["dataset"] == "digits"


def test_a_long_fire_never_holds_the_control_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 58: the schedule process's one worker ran the tick, the reconciler and the webhook
    sender one after another, so a fire that took long (a large folder to hash, a slow bucket)
    held the other two behind it. The tick task now hands its fires to a thread of its own and
    returns; another tick waits until that one ended."""
    import threading

    from mxq.workers import control

    release, started = threading.Event(), threading.Event()

    def a_long_fire(settings: object) -> list[int]:
        started.set()
        release.wait(60)
        return []

    monkeypatch.setattr(control, "tick", a_long_fire)
    assert control.tick_task() is True  # returns while the fire runs
    assert started.wait(10) and not release.is_set()
    assert control.tick_task() is False  # the last tick still runs: not a second beside it
    release.set()
    for _ in range(100):  # the fire's thread lets go of the tick once it ended
        if control._ticking.acquire(blocking=False):
            control._ticking.release()
            break
        threading.Event().wait(0.05)
    assert control.tick_task() is True
