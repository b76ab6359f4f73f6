"""Submit-time failures: one line naming the problem, exit 2, nothing written."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from mxq.db.reports.history import JobFilter, list_jobs
from mxq.since import TIME_LIMIT_EXAMPLES
from tests.conftest import Stack, free_port, wait_until

pytestmark = pytest.mark.both_legs


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mxq: error: "), proc.stderr
    return lines[0]


def test_unreachable_broker_writes_nothing(stack: Stack, tmp_path: Path) -> None:
    before = len(list_jobs(stack.settings.database, JobFilter(limit=10000)))
    # A home of its own: the stack's home records its broker, and refuses another (stack.json).
    line = _one_line(stack.mxq("probe", "--allow-offline", "--device", "cpu:0",
                               env={"MXQ_BROKER_URL": "redis://127.0.0.1:1/0",
                                    "MXQ_DATABASE_URL": stack.settings.database,
                                    "MXQ_HOME": str(tmp_path)}))
    assert "broker unreachable at redis://127.0.0.1:1/0" in line
    assert len(list_jobs(stack.settings.database, JobFilter(limit=10000))) == before


def test_unreachable_database_is_named(stack: Stack, tmp_path: Path) -> None:
    line = _one_line(stack.mxq("probe", env={  # a home of its own (see above)
        "MXQ_DATABASE_URL": "postgresql://mxq:secret@127.0.0.1:1/mxq", "MXQ_HOME": str(tmp_path)}))
    assert "database unreachable at postgresql://mxq:***@127.0.0.1:1/mxq" in line
    assert "Connection refused" in line
    assert "secret" not in line
    line = _one_line(stack.mxq("probe", env={
        "MXQ_DATABASE_URL": f"sqlite:///{tmp_path}/no/such/folder/mxq.db", "MXQ_HOME": str(tmp_path)}))
    assert "database unreachable" in line and "unable to open database file" in line


def test_zero_cpu_devices_is_refused(stack: Stack) -> None:
    line = _one_line(stack.mxq("devices", env={"MXQ_CPU_DEVICES": "0"}))
    assert "MXQ_CPU_DEVICES must be at least 1 (got 0)" in line


def test_bad_node_name_is_refused(stack: Stack) -> None:
    line = _one_line(stack.mxq("jobs", env={"MXQ_NODE": "box.1"}))
    assert "MXQ_NODE 'box.1'" in line


@pytest.mark.parametrize("token", ["", "   ", "fifteen-chars!!"], ids=["empty", "blank", "short"])
def test_an_empty_or_short_token_is_refused_at_start(stack: Stack, token: str) -> None:
    """`MXQ_API_TOKEN=` once opened the API to the network: refused before anything serves."""
    proc = stack.mxq_process("api", env={"MXQ_API_TOKEN": token, "MXQ_API_HOST": "0.0.0.0",
                                         "MXQ_API_PORT": str(free_port())}, timeout=60)
    line = _one_line(proc)
    assert f"MXQ_API_TOKEN has {len(token.strip())} characters; at least 16 are needed" in line
    assert token.strip() == "" or token not in line  # the token itself is never printed


def test_a_publish_bug_is_raised_at_once_with_its_cause(isolated: Stack,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The patient publish (workers, the reconciler) retried every error but TypeError and
    ValueError for two minutes, then dropped the cause; now only a broker that is down is waited
    out, and what is raised keeps what went wrong."""
    import kombu.exceptions

    from mxq.workers.broker.publish import SubmitError, publish

    with pytest.raises(SubmitError) as raised:
        publish(isolated.settings, object(), "probe", "pool.cpu", patient=True)  # type: ignore[arg-type]  # not JSON
    assert isinstance(raised.value.__cause__, kombu.exceptions.EncodeError)
    assert not [r for r in caplog.records if "retry" in r.getMessage()]  # no retry at all


@pytest.mark.parametrize("isolated", ["embedded"], indirect=True)
def test_a_patient_publish_waits_out_a_broker_restart(isolated: Stack,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers and the reconciler publish through a broker restart by Celery's own retry policy
    (PATIENT_RETRY_POLICY), with no loop of mxq's around it: the message lands once Redis is back."""
    import threading

    import redis.connection

    from mxq.workers.broker.messages import in_broker
    from mxq.workers.broker.publish import publish
    from mxq.workers.launch.embedded import EmbeddedRedis

    tries: list[int] = []  # connections attempted to the embedded Redis's socket
    connect = redis.connection.UnixDomainSocketConnection._connect

    def counted(self: redis.connection.UnixDomainSocketConnection) -> object:
        tries.append(1)
        return connect(self)

    monkeypatch.setattr(redis.connection.UnixDomainSocketConnection, "_connect", counted)
    server = EmbeddedRedis(isolated.home)
    assert server.stop() is None and not server.running()
    done: list[BaseException | None] = []
    sender = threading.Thread(target=lambda: done.append(
        _caught(lambda: publish(isolated.settings, 424242, "probe", "pool.cpu", patient=True))))
    sender.start()
    wait_until(lambda: len(tries), 60, "several of the policy's retries to fail", until=lambda n: n >= 3)
    assert sender.is_alive() and not done
    assert server.start()
    sender.join(60)
    assert done == [None]
    assert in_broker(isolated.settings.broker, {"pool.cpu"})[0] == {424242}


def _caught(call: Callable[[], None]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # handed to the test's thread
        return exc
    return None


def test_a_rejected_submit_keeps_a_huge_value_cut(stack: Stack) -> None:
    """A 300,000-character input path is refused and recorded as a failed job whose row keeps
    its first 1,024 characters and its length, not the whole string (nor a whole-path error)."""
    from mxq.db.reports.history import require_job
    from mxq.errors import JobRejected
    from mxq.workers.jobs.submit import STORED_CHARS, submit_request

    huge = "a" * 300_000
    with pytest.raises(JobRejected) as refused:
        submit_request(stack.settings, "infer", {"model": "mlp64", "input": huge}, "cpu:0",
                       allow_offline=True)
    record = require_job(stack.settings.database, refused.value.job_id)
    assert record["status"] == "failed"
    assert record["params"]["input"] == f"{huge[:STORED_CHARS]}… (300000 characters)"
    assert record["error"] is not None and len(record["error"]) < STORED_CHARS + 100


@pytest.mark.parametrize("limit", ["0", "0s", "0d0h", "10000d", "1000000000", "5x"])
def test_an_out_of_range_time_limit_is_refused_as_the_api_refuses_it(stack: Stack, limit: str) -> None:
    """The API's schema refuses it writing nothing: the CLI too, never a failed job."""
    before = len(list_jobs(stack.settings.database, JobFilter(limit=10000)))
    line = _one_line(stack.mxq("probe", "--allow-offline", "--device", "cpu:0", "--time-limit", limit))
    assert f"--time-limit {limit!r}: expected {TIME_LIMIT_EXAMPLES}" in line
    assert len(list_jobs(stack.settings.database, JobFilter(limit=10000))) == before
