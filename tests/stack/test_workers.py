"""Real `celery worker` processes, pinned per device, against a real broker and database."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from mxq.workers.broker.publish import publish
from mxq.workers.jobs.submit import submit
from tests.conftest import NODE, Stack, wait_until
from tests.support.workers import pid_of, wait_alive

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

SMALL = {"size": 64, "batch": 2, "repeat": 1}
# Long enough on any CPU to be caught mid-run: a few seconds of matrix multiplies.
LONG = {"size": 1024, "batch": 8, "repeat": 400}


def test_named_device_runs_on_its_worker(workers: Stack) -> None:
    proc = workers.mxq("probe", "--device", "cpu:1", "--size", "128", "--repeat", "2",
                       "--wait", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["status"] == "succeeded"
    assert (record["device"], record["worker"], record["node"]) == ("cpu:1", f"cpu1@{NODE}", NODE)
    assert record["queue"] == f"{NODE}.cpu.1"
    assert record["attempts"] == 1
    assert record["samples"] == record["params"]["batch"] * 2 and record["samples_per_sec"] > 0
    assert record["result"]["matmul_gflops"] > 0 and record["result"]["context"] == "cpu(1)"
    again = workers.mxq_json("job", str(record["id"]))
    assert again["worker"] == f"cpu1@{NODE}" and again["status"] == "succeeded"


def test_auto_spreads_jobs_over_both_devices(workers: Stack) -> None:
    ids = [submit(workers.settings, "probe", dict(SMALL), "auto") for _ in range(20)]
    records = [workers.wait(i) for i in ids]
    assert {r["status"] for r in records} == {"succeeded"}
    assert {r["queue"] for r in records} == {"pool.cpu.mxnet"}  # a probe needs MXNet
    per_device = Counter(r["device"] for r in records)
    assert set(per_device) == {"cpu:0", "cpu:1"}, per_device
    history = workers.mxq_json("jobs", "--kind", "probe", "--limit", "500")
    assert set(ids) <= {r["id"] for r in history}


def test_each_worker_consumes_its_queue_and_its_pools_only(workers: Stack) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "mxq.workers", "inspect",
                           "active_queues", "--json", "--timeout", "5"],
                          capture_output=True, text=True, env=workers.environ(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    queues = {name: sorted(q["name"] for q in qs) for name, qs in json.loads(proc.stdout).items()}
    pools = ["pool.cpu", "pool.cpu.mxnet", "pool.cpu.onnx"]  # (both engines run CPU devices)
    assert queues == {f"cpu0@{NODE}": sorted([f"{NODE}.cpu.0", *pools]),
                      f"cpu1@{NODE}": sorted([f"{NODE}.cpu.1", *pools])}


def test_devices_and_job_history_json(workers: Stack) -> None:
    done_id = workers.wait(submit(workers.settings, "probe", dict(SMALL), "cpu:1"))["id"]
    # (other tests register offline devices such as cpu:5; the live ones are the launcher's)
    devices = {d["device"]: d for d in workers.mxq_json("devices") if d["alive"]}
    assert set(devices) == {"cpu:0", "cpu:1"}
    for label, d in devices.items():
        assert d["alive"] is True
        assert d["queue"] == f"{NODE}.cpu.{label[-1]}"
        assert {"queued", "running"} <= set(d)
    done = workers.mxq_json("jobs", "--status", "succeeded", "--device", "cpu:1", "--since", "1h")
    assert done_id in {r["id"] for r in done}, done
    assert all(r["device"] == "cpu:1" and r["status"] == "succeeded" for r in done)
    for key in ("id", "kind", "status", "device", "node", "worker", "queue", "attempts",
                "samples", "seconds", "samples_per_sec", "error"):
        assert key in done[0]


def test_bad_probe_parameters_fail_the_job_at_submit(workers: Stack) -> None:
    proc = workers.mxq("probe", "--size", "3")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("mxq: error: job ") and "size=3" in line
    assert "greater than or equal to 16" in line
    record = workers.mxq_json("job", line.split()[3])
    assert record["status"] == "failed" and record["attempts"] == 0 and "size=3" in record["error"]


def test_a_bad_message_fails_its_job_and_the_worker_goes_on(workers: Stack) -> None:
    """Parameters that bypass submit (an old client, a hand-made row) fail the job, not the worker."""
    from mxq.db.jobs import create_job

    s = workers.settings
    job_id = create_job(s.database, "probe", {"size": -5}, "cpu:0", f"{NODE}.cpu.0")
    publish(s, job_id, "probe", f"{NODE}.cpu.0")
    record = workers.wait(job_id)
    assert record["status"] == "failed"
    assert "size=-5" in (record["error"] or "")
    ok = workers.wait(submit(s, "probe", dict(SMALL), "cpu:0"))
    assert ok["status"] == "succeeded" and ok["device"] == "cpu:0"


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
@pytest.mark.both_legs  # the claim in SQL runs a job once
def test_second_delivery_of_a_running_job_is_dropped(workers: Stack) -> None:
    s = workers.settings
    job_id = submit(s, "probe", dict(LONG), "cpu:0")
    workers.wait(job_id, until=("running",))
    publish(s, job_id, "probe", f"{NODE}.cpu.1")  # a redelivery, to the other device
    done = workers.wait(job_id)
    assert done["status"] == "succeeded"
    assert (done["device"], done["attempts"]) == ("cpu:0", 1)
    publish(s, job_id, "probe", f"{NODE}.cpu.1")  # and one after it finished
    probe = workers.wait(submit(s, "probe", dict(SMALL), "cpu:1"))  # cpu:1 handled both before
    assert probe["status"] == "succeeded"
    assert workers.job(job_id)["attempts"] == 1


def test_offline_device_needs_allow_offline(workers: Stack) -> None:
    from mxq.db.fleet import forget, register

    s = workers.settings
    # A device whose worker is known but not running (as after `mxq down`).
    register(s.database, f"cpu5@{NODE}", NODE, "cpu:5", f"{NODE}.cpu.5", None, {}, alive=False)
    try:
        before = len(workers.mxq_json("jobs", "--limit", "10000"))
        proc = workers.mxq("probe", "--device", "cpu:5")
        assert proc.returncode == 2
        assert "cpu:5" in proc.stderr and "no live worker" in proc.stderr
        assert "--allow-offline" in proc.stderr
        assert len(workers.mxq_json("jobs", "--limit", "10000")) == before
        queued = workers.mxq_json("probe", "--device", "cpu:5", "--allow-offline")
    finally:
        forget(s.database, f"cpu5@{NODE}")
    assert queued["status"] == "queued" and queued["queue"] == f"{NODE}.cpu.5"


@pytest.mark.parametrize("device, needle", [
    ("cpu:9", "not known on node"), ("gpu:0", "not known on node"),
    ("gpu-1", "invalid device 'gpu-1'"), ("cpu:", "invalid device"), ("tpu:0", "invalid device"),
])
def test_device_errors_are_one_line_and_write_nothing(workers: Stack, device: str,
                                                      needle: str) -> None:
    before = len(workers.mxq_json("jobs", "--limit", "10000"))
    proc = workers.mxq("probe", "--device", device)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert len(workers.mxq_json("jobs", "--limit", "10000")) == before


@pytest.mark.slow
def test_killed_worker_is_restarted_and_its_job_finishes_once(workers: Stack) -> None:
    s = workers.settings
    job_id = submit(s, "probe", dict(LONG), "cpu:0")
    running = workers.wait(job_id, until=("running",))
    pid = pid_of(workers, running["worker"])
    os.kill(pid, signal.SIGKILL)
    new_pid = wait_alive(workers, f"cpu0@{NODE}", pid)
    done = workers.wait(job_id, timeout=180)
    assert done["status"] == "succeeded"
    assert done["attempts"] == 2 and done["device"] == "cpu:0"
    assert new_pid != pid


@pytest.mark.slow
def test_job_that_kills_its_worker_every_time_fails_at_the_cap(workers: Stack) -> None:
    s = workers.settings
    job_id = submit(s, "probe", dict(LONG), "cpu:1")
    killed = 0

    def record_killing_each_attempt() -> JobRecord:
        nonlocal killed
        record = workers.job(job_id)
        if record["status"] == "running" and record["attempts"] > killed:
            pid = pid_of(workers, record["worker"])
            if pid:
                os.kill(pid, signal.SIGKILL)  # the job "kills its worker", attempt after attempt
                killed = record["attempts"]
        return record

    record = wait_until(record_killing_each_attempt, 300, f"job {job_id} to fail or succeed",
                        until=lambda record: record["status"] in ("failed", "succeeded"))
    assert record["status"] == "failed"
    assert record["attempts"] == 3 == killed
    assert "gave up after 3 attempts" in (record["error"] or "")
    wait_alive(workers, f"cpu1@{NODE}", 0)
    after = workers.wait(submit(s, "probe", dict(SMALL), "cpu:1"), timeout=120)
    assert after["status"] == "succeeded" and after["device"] == "cpu:1"


def test_a_pickled_message_is_refused_and_the_worker_goes_on(workers: Stack) -> None:
    from kombu import Connection

    from mxq.workers.broker.app import app_for

    s = workers.settings
    with Connection(s.broker) as conn:
        producer = conn.Producer(serializer="pickle")
        producer.publish({"task": "mxq.probe", "id": "evil", "args": [1], "kwargs": {}},
                         routing_key=f"{NODE}.cpu.0", exchange=f"{NODE}.cpu.0",
                         headers={"task": "mxq.probe", "id": "evil"})
    ok = workers.wait(submit(s, "probe", dict(SMALL), "cpu:0"))
    assert ok["status"] == "succeeded" and ok["device"] == "cpu:0"
    log = (workers.home / "logs" / f"cpu0-{NODE}.log").read_text()
    assert "ContentDisallowed: Refusing to deserialize untrusted content of type pickle" in log
    conf = app_for(s).conf
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.broker_transport_options["visibility_timeout"] == s.visibility_timeout
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
