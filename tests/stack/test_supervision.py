"""Supervision you can trust (issue 28, findings 3-7), on real processes where they are cheap:
processes are known by identity, not PID; what a dead launcher left is ended; a taken API port
fails `mxq up`; the embedded Redis is restarted and its death is visible; stack.json carries the
stack's broker and database."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mxq.api import routes
from mxq.api.app import app
from mxq.db.migrate import upgrade
from mxq.workers.launch import groups, procs, sqlite_lock, stack
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.launch.launcher import Child, Launcher, WorkerSpec
from mxq.workers.launch.stack import StackError, down, launcher_pidfile, preflight, run_launcher
from mxq.workers.settings import Settings
from mxq.workers.stack_record import STACK_RECORD, StackMismatch, record_stack, with_recorded_stack
from tests.conftest import free_port, run_cli, wait_until


def _sleeper(new_group: bool = False) -> subprocess.Popen:
    """A stranger: a process mxq did not start (or, with its own group, one a launcher did),
    returned once it runs its own command: until its exec, /proc shows the test's command line,
    and a record made then would name a process that is gone."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            start_new_session=new_group)
    wait_until(lambda: procs.identify(proc.pid), 30, f"pid {proc.pid} to run its command",
               until=lambda found: found is not None and "time.sleep(300)" in found.command)
    return proc


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen]:
    proc = _sleeper()
    yield proc
    proc.kill()
    proc.wait()


def _settings(home: Path, **extra: object) -> Settings:
    return Settings(home=home, node="supnode", api_port=free_port(), **extra)  # type: ignore[arg-type]


def test_identity_is_pid_start_time_and_command(stranger: subprocess.Popen) -> None:
    found = procs.identify(stranger.pid)
    assert found is not None and "time.sleep(300)" in found.command
    assert procs.matches(found)
    assert not procs.matches(procs.Proc(found.pid, found.start + 1, found.command))  # a reused PID
    assert not procs.matches(procs.Proc(found.pid, found.start, "/usr/bin/something-else"))
    assert procs.parse(str(found.pid)) is None  # a bare PID is never trusted
    stranger.kill()
    stranger.wait()
    assert not procs.matches(found)


@pytest.mark.parametrize("record", ["bare", "reused"])
def test_down_and_up_never_signal_a_stranger_named_by_launcher_pid(
        tmp_path: Path, stranger: subprocess.Popen, record: str) -> None:
    s = _settings(tmp_path)
    pidfile = launcher_pidfile(s)
    found = procs.identify(stranger.pid)
    assert found is not None
    pidfile.write_text(str(stranger.pid) if record == "bare"
                       else procs.Proc(found.pid, found.start - 1, found.command).to_json())
    stopped, notes = down(s)
    assert stopped == [] and stranger.poll() is None  # not signalled
    assert len(notes) == 1 and "stale" in notes[0] and str(stranger.pid) in notes[0]
    assert not pidfile.exists()
    pidfile.write_text(str(stranger.pid))
    said = preflight(s)  # not "already up"
    assert any("stale" in line for line in said) and stranger.poll() is None


def test_each_node_keeps_its_own_launcher_record_and_down_ends_every_live_one(
        tmp_path: Path, stranger: subprocess.Popen) -> None:
    """Two launchers in one home (issue 44, item 3; sleepers stand in for them, recorded with
    their true identity): a launcher of another node does not block this one, a live one of
    this node refuses a second (`mxq up` and `mxq worker` alike), `mxq down` ends both, and a
    record of a node whose process is not on this machine (a shared home) is left alone."""
    s = _settings(tmp_path)
    other = _sleeper()
    try:
        for node, proc in (("n3b", other), (s.node, stranger)):
            found = procs.identify(proc.pid)
            assert found is not None
            if node == s.node:
                assert preflight(s) == []  # another node's launcher is no reason to refuse
            procs.write(launcher_pidfile(s, node), found)
        with pytest.raises(StackError, match=f"already up for node {s.node} in {tmp_path}"):
            preflight(s)
        with pytest.raises(StackError, match="give another launcher its own MXQ_NODE"):
            run_launcher(s, [])
        elsewhere = launcher_pidfile(s, "elsewhere")
        elsewhere.write_text(procs.Proc(other.pid, 1, "python -m mxq.cli worker").to_json())
        stopped, notes = down(s)
        assert other.wait(timeout=30) == -signal.SIGTERM == stranger.wait(timeout=30)
        assert sorted(stopped) == sorted(f"workers (launcher pid {p.pid})" for p in (other, stranger))
        assert notes == [] and elsewhere.exists()
    finally:
        other.kill()
        other.wait()


def test_two_starts_of_one_node_at_once_leave_exactly_one_launcher(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking for a live launcher of the node and writing the record are one step (issue 44,
    item 3): here each start lets the other run between its check and its write, as two
    `mxq worker`s of one node started together can; exactly one claims the node."""
    s = _settings(tmp_path)
    both_checked = threading.Barrier(2, timeout=0.5)  # broken when the other cannot check meanwhile
    check = stack.check_node_free

    def slow_check(settings: Settings) -> list[str]:
        notes = check(settings)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_checked.wait()
        return notes

    monkeypatch.setattr(stack, "check_node_free", slow_check)
    outcomes: list[str] = []

    def start() -> None:
        try:
            stack.claim_node(s, procs.me())
            outcomes.append("claimed")
        except StackError as exc:
            outcomes.append("refused" if "already up for node" in str(exc) else str(exc))

    starts = [threading.Thread(target=start) for _ in range(2)]
    for t in starts:
        t.start()
    for t in starts:
        t.join(timeout=30)
    assert sorted(outcomes) == ["claimed", "refused"]
    assert procs.read(launcher_pidfile(s)) == procs.me()


def test_up_ends_what_a_dead_launcher_left_and_leaves_strangers(tmp_path: Path,
                                                                stranger: subprocess.Popen) -> None:
    s = _settings(tmp_path)
    orphan = _sleeper(new_group=True)  # a launcher's child: it leads its own group
    try:
        leader = procs.identify(orphan.pid)
        other = procs.identify(stranger.pid)
        assert leader is not None and other is not None
        # The stranger recorded with another start time: a group id the kernel has reused.
        groups.record(s.home_path, s.node, [leader, procs.Proc(other.pid, other.start - 5,
                                                                 other.command)])
        said = preflight(s)
        assert any("ended 1 processes a dead launcher had left running" in line for line in said)
        assert orphan.wait(timeout=30) == -signal.SIGTERM
        assert stranger.poll() is None
        assert not groups.groups_file(s.home_path, s.node).exists()
    finally:
        orphan.kill()
        orphan.wait()


def test_up_fails_on_a_taken_api_port_naming_it_and_its_holder(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StackError) as err:
            preflight(Settings(home=tmp_path, node="supnode", api_port=port))
        message = str(err.value)
        assert f"127.0.0.1:{port}" in message and f"pid {os.getpid()}" in message
        assert "MXQ_API_PORT" in message and "\n" not in message
        proc = run_cli(["up", "--detach"], {"MXQ_HOME": str(tmp_path / "cli"), "MXQ_NODE": "supnode",
                                            "MXQ_API_PORT": str(port)})
    assert proc.returncode == 2 and f"127.0.0.1:{port} is in use" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cli" / "redis.sock").exists()  # refused before starting anything


def test_launcher_restarts_the_embedded_redis_when_it_dies(tmp_path: Path) -> None:
    redis = EmbeddedRedis(tmp_path)
    redis.start()
    try:
        first = redis.recorded()
        assert first is not None and redis.alive()
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: procs.matches(first), 10, "Redis to die", until=lambda alive: not alive)
        assert not redis.alive()
        Launcher(_settings(tmp_path), [])._watch_broker(time.monotonic())
        again = redis.recorded()
        assert again is not None and again != first and redis.alive() and redis.running()
    finally:
        redis.stop()


STOPPED_INSIDE_A_WRITE = """
import os, pathlib, signal, sqlite3, sys, time
started = pathlib.Path(sys.argv[1] + ".started")
if started.exists():  # restarted: a worker that behaves
    time.sleep(300)
started.touch()
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")  # the WAL write lock, held until commit
db.execute("INSERT INTO t VALUES (1)")
os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the transaction
db.execute("COMMIT")
"""


def test_a_child_stopped_holding_the_sqlite_write_lock_is_killed_and_restarted(tmp_path: Path) -> None:
    """Every writer of an embedded stack waits behind a process stopped inside a write
    transaction; its launcher kills it after the heartbeat TTL, and the database takes writes."""
    settings = _settings(tmp_path, heartbeat_seconds=0.2)
    path = Path(settings.database.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x INTEGER)")
    spec = WorkerSpec(None, "writer@supnode", [], [sys.executable, "-c", STOPPED_INSIDE_A_WRITE,
                                                   str(path)], dict(os.environ))
    launcher = Launcher(settings, [spec])
    child = launcher.children[0]
    launcher._start(child)
    assert child.proc is not None
    first = child.proc.pid
    try:
        wait_until(lambda: sqlite_lock.writer(settings.database), 30, "the child to hold the lock",
                   until=lambda pid: pid == first and procs.stopped(first))
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            sqlite3.connect(path, timeout=0.2).execute("INSERT INTO t VALUES (2)")

        def watched() -> subprocess.Popen | None:
            launcher._watch()
            return child.proc

        wait_until(watched, 30, "the launcher to kill and restart it",
                   until=lambda proc: proc is not None and proc.pid != first, interval=0.1)
        assert child.crashes == 1 and not procs.group_members(first)
        with sqlite3.connect(path, timeout=5) as db:  # the write lock is free again
            db.execute("INSERT INTO t VALUES (3)")
            assert [x for (x,) in db.execute("SELECT x FROM t")] == [3]  # the stopped write rolled back
    finally:
        for c in launcher.children:
            if c.proc is not None:
                os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
        EmbeddedRedis(settings.home_path).stop()  # the launcher's watch started it: never left behind


def test_a_stale_redis_record_is_not_signalled(tmp_path: Path, stranger: subprocess.Popen) -> None:
    redis = EmbeddedRedis(tmp_path)
    found = procs.identify(stranger.pid)
    assert found is not None
    procs.write(redis.record, procs.Proc(found.pid, found.start + 3, "redis-server"))
    note = redis.stop()
    assert note is not None and "stale redis.proc" in note and not redis.record.exists()
    assert stranger.poll() is None


@pytest.fixture
def broker_down(tmp_path: Path) -> Iterator[Settings]:
    """A migrated database whose embedded broker does not run (as after a SIGKILL)."""
    s = _settings(tmp_path)
    upgrade(s.database)
    app.dependency_overrides[routes.settings] = lambda: s
    yield s
    app.dependency_overrides.clear()


def test_health_and_metrics_say_the_broker_is_down(broker_down: Settings) -> None:
    client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
    health = client.get("/api/v1/devices")
    assert health.status_code == 503, health.text
    assert health.json()["detail"].startswith("broker unreachable at redis+socket://")
    metrics = client.get("/metrics").text
    assert "mxq_broker_up 0.0" in metrics and "mxq_database_up 1.0" in metrics
    redis = EmbeddedRedis(broker_down.home_path)
    redis.start()
    try:
        assert client.get("/api/v1/devices").status_code == 200
        assert "mxq_broker_up 1.0" in client.get("/metrics").text
    finally:
        redis.stop()


def test_health_says_the_database_is_down(tmp_path: Path) -> None:
    s = _settings(tmp_path, database_url="postgresql://127.0.0.1:1/none")
    redis = EmbeddedRedis(s.home_path)
    redis.start()
    app.dependency_overrides[routes.settings] = lambda: s
    try:
        client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        health = client.get("/api/v1/devices")
        assert health.status_code == 503 and "database" in health.json()["detail"]
        metrics = client.get("/metrics").text
        assert "mxq_database_up 0.0" in metrics and "mxq_broker_up 1.0" in metrics
    finally:
        app.dependency_overrides.clear()
        redis.stop()


PG = "postgresql://mxq:s3cret@127.0.0.1:5432/a"


def test_stack_json_records_broker_and_database_without_password(tmp_path: Path) -> None:
    record_stack(Settings(home=tmp_path, broker_url="redis://:hidden@127.0.0.1:6379/3",
                          database_url=PG))
    text = (tmp_path / STACK_RECORD).read_text()
    assert "s3cret" not in text and "hidden" not in text
    record = json.loads(text)
    assert record["database"] == "postgresql://mxq@127.0.0.1:5432/a"
    assert record["broker"] == "redis://127.0.0.1:6379/3" and record["database_password"] is True
    # The same URLs with their password match; unset ones cannot be used (no password stored).
    same = with_recorded_stack(Settings(home=tmp_path, broker_url="redis://:hidden@127.0.0.1:6379/3",
                                        database_url=PG))
    assert same.database == PG
    with pytest.raises(StackMismatch, match="password is not stored; set MXQ_DATABASE_URL"):
        with_recorded_stack(Settings(home=tmp_path, broker_url="redis://127.0.0.1:6379/3"))


def test_every_command_uses_the_recorded_stack_or_refuses_another(tmp_path: Path) -> None:
    db = tmp_path / "elsewhere.db"
    upgrade(f"sqlite:///{db}")
    record_stack(Settings(home=tmp_path / "home", database_url=f"sqlite:///{db}"))
    home = {"MXQ_HOME": str(tmp_path / "home"), "MXQ_NODE": "supnode"}
    used = with_recorded_stack(Settings(home=tmp_path / "home"))
    assert used.database == f"sqlite:///{db}" and used.embedded_broker  # the broker: the default
    jobs = run_cli(["jobs", "--json"], home)  # no MXQ_DATABASE_URL in the shell: the recorded one
    assert jobs.returncode == 0, jobs.stderr
    assert not (tmp_path / "home" / "mxq.db").exists()  # no empty SQLite left in the home
    other = run_cli(["jobs"], {**home, "MXQ_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}"})
    assert other.returncode == 2 and "Traceback" not in other.stderr
    line = other.stderr.strip()
    assert "\n" not in line and f"sqlite:///{db}" in line and f"{tmp_path / 'b.db'}" in line
    assert "unset it or use another MXQ_HOME" in line


def test_every_child_the_launcher_starts_is_recorded_as_itself(tmp_path: Path) -> None:
    """CI once found `mxq down` leaving the schedule process and its beat child running after the
    launcher died: read at once after Popen, a child's /proc/PID/cmdline can still be empty (2 of
    1,000 starts here), its record never matched it again, and down took the group for a
    stranger's. Started as the launcher starts the schedule process, 2,000 times, every child is
    recorded as itself."""
    settings = _settings(tmp_path)
    spec = WorkerSpec(None, "schedule@supnode", [],
                      [sys.executable, "-c", "import time; time.sleep(60)", "an   argument"],
                      dict(os.environ))
    launcher = Launcher(settings, [spec])
    child = launcher.children[0]
    wrong = []
    for _ in range(2000):
        launcher._start(child)
        assert child.proc is not None
        try:
            leader = child.leader
            assert leader is not None and groups.records(settings.home_path, settings.node) == [leader]
            wait_until(partial(procs.command_of, leader.pid), 10, "the child's arguments", until=bool)
            if not procs.matches(leader):
                wrong.append((leader, procs.identify(leader.pid)))
        finally:
            child.proc.kill()
            child.proc.wait()
    assert not wrong, wrong



REFUSES_ONCE = """
import pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("refused once")
    print("%s the device failed its start check", flush=True)
    sys.exit(%d)
time.sleep(120)
"""


def test_a_refused_device_is_probed_again_and_its_worker_starts_when_it_heals(tmp_path: Path) -> None:
    """A worker that refused its device was never started again: the jobs queued to that device
    waited forever. The launcher now starts it again after a backoff; here the stand-in worker
    refuses once (its device "fails its start check"), then runs."""
    from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT
    s = _settings(tmp_path, broker_url="redis://127.0.0.1:1/0", reprobe_seconds=0.5)
    script = REFUSES_ONCE % (REFUSAL_PREFIX, REFUSED_EXIT)
    worker = WorkerSpec(None, "flaky@supnode", ["q"], [sys.executable, "-c", script,
                                                       str(tmp_path / "marker")], dict(os.environ))
    sleeps = [sys.executable, "-c", "import time; time.sleep(120)"]
    sleeper = WorkerSpec(None, "other@supnode", ["q2"], sleeps, dict(os.environ))
    launcher = Launcher(s, [worker, sleeper])
    flaky = launcher.children[0]
    try:
        for child in launcher.children:
            launcher._start(child)
        def watched() -> Child:
            launcher._watch()
            return flaky

        wait_until(watched, 30, "the first start to refuse", until=lambda c: c.refused)
        assert flaky.proc is None and flaky.refusals == 1
        wait_until(watched, 30, "the device to be probed again", until=lambda c: c.proc is not None)
        started = flaky.proc
        assert started is not None and started.poll() is None and not flaky.refused  # it healed
        launcher._watch()
        assert flaky.proc is started and flaky.refusals == 1
    finally:
        launcher._stop_all()


def test_a_worker_running_a_minute_has_its_refusals_forgotten(tmp_path: Path) -> None:
    """Issue 60: a device's refusals lengthen its next probe's wait (doubling, up to 30 minutes)
    and were never forgotten, so after a few transient faults every outage cost 30 minutes.
    A worker that has run STABLE_SECONDS since its last start has them reset."""
    from mxq.workers.launch.launcher import STABLE_SECONDS

    settings = _settings(tmp_path, broker_url="redis://127.0.0.1:1/0")  # no embedded Redis to watch
    spec = WorkerSpec(None, "healed@supnode", [], [sys.executable, "-c", "import time; time.sleep(60)"],
                      dict(os.environ))
    launcher = Launcher(settings, [spec])
    child = launcher.children[0]
    launcher._start(child)
    try:
        child.refusals, child.restart_at = 3, time.monotonic() - STABLE_SECONDS / 2
        launcher._watch()
        assert child.refusals == 3  # not yet
        child.restart_at = time.monotonic() - STABLE_SECONDS - 1
        launcher._watch()
        assert child.refusals == 0 and child.proc is not None and child.proc.poll() is None
    finally:
        assert child.proc is not None
        os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait()


def test_a_node_whose_every_device_is_out_keeps_its_launcher_and_comes_back(tmp_path: Path) -> None:
    """Issue 60: a launcher whose every worker refused its device exited (a one-GPU node, an
    `mxq worker` node; under Compose it was restarted and told device.out again each time). It
    now keeps probing, and starts the worker once its device passes."""
    from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT
    s = _settings(tmp_path, broker_url="redis://127.0.0.1:1/0", reprobe_seconds=0.5)
    script = REFUSES_ONCE % (REFUSAL_PREFIX, REFUSED_EXIT)
    only = WorkerSpec(None, "lonely@supnode", ["q"], [sys.executable, "-c", script,
                                                      str(tmp_path / "marker")], dict(os.environ))
    launcher = Launcher(s, [only])
    launcher._register = lambda: None  # type: ignore[method-assign]  # no database to register in
    child = launcher.children[0]
    ended: list[int] = []
    running = threading.Thread(target=lambda: ended.append(launcher.run()), daemon=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(signal, "signal", lambda *a: None)  # run() sets handlers: main thread only
        running.start()
        try:
            wait_until(lambda: child.refusals, 30, "its only device to refuse", until=lambda n: n >= 1)
            wait_until(lambda: child.proc, 30, "the launcher to probe it again and start it",
                       until=lambda proc: proc is not None and proc.poll() is None and not child.refused)
            assert running.is_alive() and ended == []
        finally:
            launcher.stopping = True
            running.join(30)
    assert ended == [0]
