"""Inference schedules on a controllable clock, against a real database and broker (no workers:
what a fire queues stays queued): each new file scored once per model version, by its bytes."""

from __future__ import annotations

import hashlib
import io
import os
import re
import threading
import uuid
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from mxq.db import schedules
from mxq.db.reports.history import require_job
from mxq.db.schedules import claims
from mxq.errors import MxqError
from mxq.workers.jobs.submit import submit_request
from mxq.workers.schedules import scoring
from mxq.workers.schedules.fires import run_now, tick
from mxq.workers.schedules.scoring import add_infer_schedule
from mxq.workers.schedules.sources import Found
from mxq.workers.settings import Settings
from tests.conftest import Stack
from tests.support.s3 import S3Server
from tests.support.schedules import T0

pytestmark = pytest.mark.both_legs


def _model(stack: Stack, name: str) -> None:
    added = stack.mxq("models", "add", name, "--arch", "mlp", "--input-shape", "4", "--classes", "3")
    assert added.returncode == 0, added.stderr


def _drop(folder: Path, name: str, seed: int, rows: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    np.save(path, np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32))
    return path


def _scored(stack: Stack, name: str) -> list[tuple[str, int]]:
    """(input, version) of every job the schedule's fires made, in order."""
    made = [j for f in schedules.fires(stack.settings.database, name) for j in f["jobs"]]
    jobs = [require_job(stack.settings.database, j) for j in made]
    return [(Path(j["params"]["input"]).name, j["params"]["model_version"]) for j in jobs]


def test_each_new_file_is_scored_once_by_its_bytes(isolated: Stack) -> None:
    _model(isolated, "poll")
    inbox = isolated.home / "data" / "inbox"
    for i in range(3):
        _drop(inbox, f"f{i}.npy", i)
    added = add_infer_schedule(isolated.settings, "poll-inbox", "@every 1m", "UTC", "inbox/*.npy",
                               {"model": "poll", "output": "db"}, now=T0)
    assert added["kind"] == "infer" and added["next_fire_at"] == (T0 + timedelta(minutes=1)).isoformat()
    assert tick(isolated.settings, T0 + timedelta(seconds=61))
    assert _scored(isolated, "poll-inbox") == [("f0.npy", 1), ("f1.npy", 1), ("f2.npy", 1)]
    from mxq.workers.schedules.sources import every_file as listed

    def landing_mid_fire(settings: Settings, source: str) -> list[Found]:
        found = listed(settings, source)
        _drop(inbox, "f3.npy", 3)  # lands while the fire submits what it listed
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scoring, "every_file", landing_mid_fire)
        tick(isolated.settings, T0 + timedelta(seconds=122))  # nothing new but f3, which it missed
    tick(isolated.settings, T0 + timedelta(seconds=150))  # not due yet
    tick(isolated.settings, T0 + timedelta(seconds=183))  # the next fire scores f3, alone
    _drop(inbox, "f0.npy", 10)  # rewritten in place with other bytes: new
    os.rename(inbox / "f1.npy", inbox / "renamed.npy")  # the same bytes: not new
    os.utime(inbox / "f2.npy")  # touched, the same bytes: not new
    tick(isolated.settings, T0 + timedelta(seconds=244))
    fires = schedules.fires(isolated.settings.database, "poll-inbox")
    assert [f["scored"] for f in fires] == [3, 0, 1, 1]
    assert _scored(isolated, "poll-inbox")[3:] == [("f3.npy", 1), ("f0.npy", 1)]
    for fire in fires:
        for job_id in fire["jobs"]:
            job = require_job(isolated.settings.database, job_id)
            assert job["status"] == "queued" and job["owner"] == added["owner"]


def test_hidden_files_fifos_and_files_swapped_for_fifos_are_never_read(isolated: Stack) -> None:
    """As a shell's glob, a fire skips hidden names (a tool's temporary `.f1.new.npy.part.npy`,
    a hidden folder under `**`); a FIFO is no data; and a listed file replaced by a FIFO while
    the fire hashes another is passed over, never waited on (it hung the schedule process)."""
    _model(isolated, "flight")
    inbox = isolated.home / "data" / "flight"
    _drop(inbox, "a.npy", 1)
    _drop(inbox, "b.npy", 2)
    _drop(inbox, ".f1.new.npy.part.npy", 3)
    _drop(inbox / ".partial", "c.npy", 4)
    _drop(inbox / "day", "d.npy", 5)
    os.mkfifo(inbox / "pipe.npy")
    add_infer_schedule(isolated.settings, "flight-inbox", "@every 1m", "UTC", "flight/**/*.npy",
                       {"model": "flight"}, now=T0)
    from mxq.workers.schedules.sources import every_file as listed

    def swapped_mid_fire(settings: Settings, source: str) -> list[Found]:
        found = listed(settings, source)
        os.mkfifo(inbox / "swap")
        os.replace(inbox / "swap", inbox / "b.npy")  # b was listed; it is a FIFO when hashed
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scoring, "every_file", swapped_mid_fire)
        firing = threading.Thread(target=tick, args=(isolated.settings, T0 + timedelta(seconds=61)),
                                  daemon=True)
        firing.start()
        firing.join(60)
        if firing.is_alive():  # the fire waits for a writer: let it go, then fail
            with open(inbox / "b.npy", "wb"):
                pass
            pytest.fail("the fire blocked on a FIFO moved over a listed file")
    assert sorted(_scored(isolated, "flight-inbox")) == [("a.npy", 1), ("d.npy", 1)]


def test_a_fire_that_died_mid_submit_makes_each_job_once(isolated: Stack) -> None:
    """Claimed but not submitted, and submitted but not settled: the next fire finishes both
    without a second job (the claim's idempotency key finds the first)."""
    _model(isolated, "crashy")
    inbox = isolated.home / "data" / "crash"
    a, b = _drop(inbox, "a.npy", 1), _drop(inbox, "b.npy", 2)
    add_infer_schedule(isolated.settings, "crashy-inbox", "0 3 * * *", "UTC", "crash/*.npy",
                       {"model": "crashy"}, now=T0)
    sched = schedules.get(isolated.settings.database, "crashy-inbox")
    dead = schedules.record_manual(isolated.settings.database, sched["id"], T0)
    db = isolated.settings.database
    by = claims.Scorer(sched["id"], "crashy", 1)
    claim_a = claims.claim(db, by, _sighting(a), dead)
    claim_b = claims.claim(db, by, _sighting(b), dead)
    first_b = submit_request(isolated.settings, "infer", {"model": "crashy", "model_version": 1,
                                                          "input": str(b)},
                             idempotency_key=claims.key_of(claim_b.id), owner=sched["owner"],
                             allow_offline=True)
    run_now(isolated.settings, "crashy-inbox", T0 + timedelta(minutes=1))
    fires = schedules.fires(db, "crashy-inbox")
    made = sorted(j for f in fires for j in f["jobs"])
    assert len(made) == 2 and first_b.job_id in made, fires
    assert claims.claim(db, by, _sighting(a), dead).id == claim_a.id


def _sighting(path: Path) -> claims.Sighting:
    from mxq.workers.schedules.scoring import sighting_of
    from mxq.workers.schedules.sources import Found

    st = path.stat()
    found = sighting_of(Found(str(path), st.st_size, st.st_mtime_ns))
    assert found is not None
    return found


def test_a_bucket_prefix_is_scored_by_etag(isolated: Stack) -> None:
    _model(isolated, "bucketed")
    server, prefix = S3Server.shared(), f"in/infer-sched/{uuid.uuid4().hex}/"

    def put(key: str, seed: int) -> str:
        buf = io.BytesIO()
        np.save(buf, np.random.default_rng(seed).normal(size=(5, 4)).astype(np.float32))
        return server.put(prefix + key, buf.getvalue())

    for i in range(3):
        put(f"day{i}.npy", i)
    add_infer_schedule(isolated.settings, "bucket-poll", "@every 5m", "UTC",
                       f"s3://mxq-tests/{prefix}", {"model": "bucketed"}, now=T0)
    tick(isolated.settings, T0 + timedelta(minutes=5))
    put("day3.npy", 3)
    put("day0.npy", 10)  # rewritten: a new ETag
    tick(isolated.settings, T0 + timedelta(minutes=10))
    tick(isolated.settings, T0 + timedelta(minutes=15))
    assert [f["scored"] for f in schedules.fires(isolated.settings.database, "bucket-poll")] == [3, 2, 0]
    assert sorted(n for n, _ in _scored(isolated, "bucket-poll")) == [
        "day0.npy", "day0.npy", "day1.npy", "day2.npy", "day3.npy"]


def test_a_promotion_rescores_the_standing_inputs_at_low_priority(isolated: Stack) -> None:
    _model(isolated, "promo")
    inbox = isolated.home / "data" / "standing"
    for i in range(2):
        _drop(inbox, f"s{i}.npy", i)
    add_infer_schedule(isolated.settings, "promo-standing", "0 3 * * *", "UTC", "standing/*.npy",
                       {"model": "promo"}, now=T0)
    run_now(isolated.settings, "promo-standing", T0)
    tick(isolated.settings, T0 + timedelta(minutes=1))  # nothing promoted: no fire
    _model(isolated, "promo")  # version 2
    assert isolated.mxq("models", "promote", "promo", "2").returncode == 0
    made = tick(isolated.settings, T0 + timedelta(minutes=2))
    tick(isolated.settings, T0 + timedelta(minutes=3))  # once
    assert len(made) == 1
    fires = schedules.fires(isolated.settings.database, "promo-standing")
    assert [f["rescore_version"] for f in fires] == [None, 2]
    assert _scored(isolated, "promo-standing") == [("s0.npy", 1), ("s1.npy", 1),
                                                   ("s0.npy", 2), ("s1.npy", 2)]
    for job_id in fires[1]["jobs"]:
        job = require_job(isolated.settings.database, job_id)
        assert job["priority"] == "low" and job["preemptible"]


def test_a_promotion_rescores_even_when_a_regular_fire_is_due_at_that_moment(isolated: Stack) -> None:
    """Issue 58: on an `--every` schedule, a promotion met by a fire due at that very tick was
    scored by the regular fire at normal priority, never re-scored. Whichever fire sees the
    promotion first is the re-score, once; a schedule that never fired scores its files once, at
    its own priority (nothing to re-score)."""
    _model(isolated, "racy")
    inbox = isolated.home / "data" / "racy"
    for i in range(3):
        _drop(inbox, f"r{i}.npy", i)
    add_infer_schedule(isolated.settings, "racy-every", "@every 1m", "UTC", "racy/*.npy",
                       {"model": "racy"}, now=T0)
    add_infer_schedule(isolated.settings, "racy-never", "0 3 * * *", "UTC", "racy/*.npy",
                       {"model": "racy"}, now=T0)  # not due in this test: fired by hand
    assert tick(isolated.settings, T0 + timedelta(seconds=61))  # racy-every's first fire
    _model(isolated, "racy")  # version 2, promoted with the next fire due
    assert isolated.mxq("models", "promote", "racy", "2").returncode == 0
    made = tick(isolated.settings, T0 + timedelta(seconds=122))  # due, and a promotion to see
    tick(isolated.settings, T0 + timedelta(seconds=183))  # nothing new: no job
    assert len(made) == 1
    fires = schedules.fires(isolated.settings.database, "racy-every")
    assert [(f["rescore_version"], f["scored"]) for f in fires] == [(None, 3), (2, 3), (None, 0)]
    for job_id in fires[1]["jobs"]:
        job = require_job(isolated.settings.database, job_id)
        assert (job["priority"], job["params"]["model_version"]) == ("low", 2)
    run_now(isolated.settings, "racy-never", T0 + timedelta(seconds=190))  # its first fire
    [first] = schedules.fires(isolated.settings.database, "racy-never")
    assert (first["rescore_version"], first["scored"]) == (None, 3)
    assert {require_job(isolated.settings.database, j)["priority"] for j in first["jobs"]} == {"normal"}


def test_one_users_schedule_neither_blocks_nor_reveals_anothers(isolated: Stack) -> None:
    """Issue 58: claims were unique per (model, version, bytes) whoever owned the schedule: bob
    copied one of alice's files into his folder and scored it first, and alice's schedule never
    scored hers (the claim pointed at bob's private job), her --unscored said nothing was
    missing. Each schedule now scores its own files, and sees only its own claims."""
    db = isolated.settings.database
    _model(isolated, "shared")
    theirs = isolated.home / "data" / "alice"
    hers = _drop(theirs, "a.npy", 1)
    mine = isolated.home / "data" / "bob"
    mine.mkdir()
    (mine / "copy.npy").write_bytes(hers.read_bytes())
    add_infer_schedule(isolated.settings, "bob-scores", "@every 1m", "UTC", "bob/*.npy",
                       {"model": "shared"}, now=T0, owner="bob")
    add_infer_schedule(isolated.settings, "alice-scores", "@every 1m", "UTC", "alice/*.npy",
                       {"model": "shared"}, now=T0 + timedelta(seconds=30), owner="alice")
    run_now(isolated.settings, "bob-scores", T0)
    [bobs] = schedules.fires(db, "bob-scores")[0]["jobs"]
    assert [i["location"] for i in scoring.unscored(isolated.settings, "alice-scores")[1]] == [str(hers)]
    run_now(isolated.settings, "alice-scores", T0)
    [alices] = schedules.fires(db, "alice-scores")[0]["jobs"]
    assert alices != bobs and require_job(db, alices)["owner"] == "alice"
    assert require_job(db, alices)["params"]["input"] == str(hers)
    assert scoring.unscored(isolated.settings, "alice-scores")[1] == []


def test_a_removed_users_schedules_stop_firing(isolated: Stack) -> None:
    """Issue 58: a removed user's schedules kept firing, their jobs owned by the removed user.
    `mxq users rm` pauses them, and one resumed by hand still never fires."""
    from mxq.db.sharing import users
    from mxq.users import Role

    db = isolated.settings.database
    _model(isolated, "gone")
    _drop(isolated.home / "data" / "gone", "g.npy", 1)
    users.add(db, "rita", Role.SUBMIT)
    add_infer_schedule(isolated.settings, "rita-scores", "@every 1m", "UTC", "gone/*.npy",
                       {"model": "gone"}, now=T0, owner="rita")
    users.remove(db, "rita")
    assert schedules.get(db, "rita-scores")["enabled"] is False
    schedules.set_enabled(db, "rita-scores", True)
    assert tick(isolated.settings, T0 + timedelta(seconds=61)) == []
    assert schedules.fires(db, "rita-scores") == []


@pytest.mark.parametrize(("source", "request_", "extra", "says"), [
    ("inbox/*.npy", {"model": "nosuch"}, {}, "unknown model 'nosuch'"),
    ("/etc/*", {"model": "checked"}, {}, "outside"),
    ("s3://elsewhere/x/", {"model": "checked"}, {}, "MXQ_S3_ALLOWED"),
    ("inbox/*.npy", {"model": "checked:1"}, {"rescore": "low"}, "pins a version"),
    ("inbox/*.npy", {"model": "checked", "model_version": 1}, {"rescore": "low"}, "pins a version"),
    ("inbox/*.npy", {"model": "checked:x"}, {}, "positive number"),
    ("inbox/*.npy", {"model": "checked", "threshold": 0.3}, {}, "not multi-label"),
    ("inbox/*.npy", {"model": "checked", "engine": "nosuch"}, {}, "engine"),
    ("inbox/" + "a" * 300 + "/*.npy", {"model": "checked"}, {}, "at most 255 bytes a file or folder name"),
    ("inbox/" + "a" * 5000, {"model": "checked"}, {}, "at most 4,095 bytes a path"),
    ("inbox/*.npy", {"model": "checked"}, {"device": "gpu:7"}, "device gpu:7 is not known on node"),
])
def test_a_bad_inference_schedule_is_refused_when_added(isolated: Stack, source: str, request_: dict,
                                                         extra: dict, says: str) -> None:
    _model(isolated, "checked")
    with pytest.raises(MxqError, match=says):
        add_infer_schedule(isolated.settings, "bad", "@every 1m", "UTC", source, request_,
                           **{"rescore": None, **extra}, now=T0)


def test_every_takes_a_duration_within_bounds(isolated: Stack) -> None:
    _model(isolated, "every")
    for every, says in (("5s", "10s to 366d"), ("soon", "expected")):
        proc = isolated.mxq("schedule", "add", "e", "--infer", "every", "--input", "x/*.npy",
                            "--every", every)
        assert proc.returncode != 0 and says in proc.stderr, proc.stderr
    proc = isolated.mxq("schedule", "add", "e", "--infer", "every", "--input", "x/*.npy",
                        "--every", "10m", "--cron", "0 3 * * *")
    assert proc.returncode != 0 and "one of them" in proc.stderr, proc.stderr
    proc = isolated.mxq("schedule", "add", "e", "--infer", "every", "--input", "x/*.npy",
                        "--every", "90m", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"cron": "@every 1h30m"' in proc.stdout


def test_lineage_names_the_bytes_and_the_inputs_left_to_score(isolated: Stack) -> None:
    _model(isolated, "lined")
    inbox = isolated.home / "data" / "lined"
    first = _drop(inbox, "a.npy", 1)
    add_infer_schedule(isolated.settings, "lined-inbox", "@every 1m", "UTC", "lined/*.npy",
                       {"model": "lined", "output": "npy"}, now=T0)
    assert [i["location"] for i in isolated.mxq_json("lineage", "--unscored", "lined-inbox")[
        "inputs"]] == [str(first)]
    run_now(isolated.settings, "lined-inbox", T0)
    (job_id,) = schedules.fires(isolated.settings.database, "lined-inbox")[0]["jobs"]
    line = isolated.mxq_json("lineage", str(job_id))
    data = first.read_bytes()
    assert line["input_bytes"] == f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
    assert (line["model"], line["model_version"], line["schedule"]) == ("lined", 1, "lined-inbox")
    assert line["output_format"] == "npy" and line["status"] == "queued" and line["engine"] is None
    assert [r["job_id"] for r in isolated.mxq_json("lineage", "--model", "lined:1")] == [job_id]
    assert isolated.mxq_json("lineage", "--model", "lined:2") == []
    assert isolated.mxq_json("lineage", "--unscored", "lined-inbox")["inputs"] == []
    later = _drop(inbox, "b.npy", 2)
    missing = isolated.mxq_json("lineage", "--unscored", "lined-inbox")
    assert missing["version"] == 1 and [i["location"] for i in missing["inputs"]] == [str(later)]
    for wrong, says in ((["999999"], "no lineage"), (["--model", "lined", "--output", "x"], "one of"),
                        (["--unscored", "nosuch"], "unknown schedule")):
        proc = isolated.mxq("lineage", *wrong)
        assert proc.returncode != 0 and says in proc.stderr, proc.stderr


def test_a_file_name_with_terminal_escapes_is_shown_escaped(isolated: Stack) -> None:
    """A name from outside (a schedule's file) holding an escape sequence, a bell and Rich's
    markup: `mxq job` and `mxq lineage` show it as characters, never as the terminal's commands."""
    _model(isolated, "escaped")
    inbox = isolated.home / "data" / "escaped"
    _drop(inbox, "x\x1b]0;owned\x07\x1b[2J[red].npy", 1)
    add_infer_schedule(isolated.settings, "escaped-inbox", "@every 1m", "UTC", "escaped/*.npy",
                       {"model": "escaped", "output": "npy"}, now=T0)
    run_now(isolated.settings, "escaped-inbox", T0)
    (job_id,) = schedules.fires(isolated.settings.database, "escaped-inbox")[0]["jobs"]
    for command in (["job", str(job_id)], ["lineage", str(job_id)]):
        proc = isolated.mxq(*command)
        assert proc.returncode == 0, proc.stderr
        # its sequences never reach the terminal raw (Rich's own styling may, on a colour terminal)
        assert "\x1b]0;owned" not in proc.stdout and "\x1b[2J" not in proc.stdout, command
        assert "\x07" not in proc.stdout, command
        shown = re.sub(r"[\s│]+", "", proc.stdout)  # a long path wraps inside its table cell
        assert r"x\x1b]0;owned\x07\x1b[2J[red].npy" in shown, command
