"""The dashboard in real headless Chromium (Debian's `chromium`, installed by `make test`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mxq.workers.jobs.submit import submit
from tests.conftest import ROOT, Stack, free_port, missing, wait_until

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "var" / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900", "--virtual-time-budget=8000"]


@pytest.fixture
def api_url(workers: Stack, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mxq.cli", "api"], cwd=ROOT,
                            env=workers.environ(MXQ_API_PORT=str(port)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def connect_error() -> str | None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError as exc:
            assert proc.poll() is None, f"the API did not start: it exited with {proc.returncode}"
            return repr(exc)
        return None

    wait_until(connect_error, 60, f"the API to accept connections on port {port}",
               until=lambda error: error is None, interval=0.2)
    yield f"http://127.0.0.1:{port}/"
    proc.terminate()
    proc.wait(30)


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium")
    if exe is None:
        missing("Debian's chromium is not installed (`make test` installs it as root)")
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120)


def _chart(dom: str) -> str:
    """The rendered throughput chart of a dumped page."""
    chart = dom[dom.index('id="throughput-chart"'):]
    return chart[:chart.index("</svg>")]


def test_dashboard_lists_jobs_and_shows_a_throughput_chart(workers: Stack, mlp: dict, api_url: str,
                                                           tmp_path: Path) -> None:
    s = workers.settings
    np.save(workers.home / "data" / "dash.npy", np.ones((150_000, 64), np.float32))
    infer = submit(s, "infer", {"model": "mlp64", "input": "dash.npy", "batch_size": 64}, "cpu:0")
    probe = submit(s, "probe", {"size": 64}, "cpu:1")
    assert workers.wait(infer, timeout=300)["status"] == "succeeded"
    workers.wait(probe)
    page = f"{api_url}#job={infer}"
    dom = _chromium(["--dump-dom", page], tmp_path / "p1").stdout
    assert f'data-job-id="{infer}"' in dom and f'data-job-id="{probe}"' in dom
    chart = _chart(dom)
    assert "<polyline" in chart and 'class="series' in chart
    assert "no throughput points yet" not in chart
    done = _chart(_chromium(["--dump-dom", f"{api_url}#job={probe}"], tmp_path / "p3").stdout)
    assert "no throughput points recorded" in done and "no throughput points yet" not in done

    train = submit(s, "train", {"arch": "mlp", "dataset": "digits", "name": "dash-train",
                                "epochs": 2, "devices": 2}, "cpu:0")
    assert workers.wait(train, timeout=300)["status"] == "succeeded"
    trained = _chromium(["--dump-dom", f"{api_url}#job={train}"], tmp_path / "p4").stdout
    assert "<dt>model</dt><dd>dash-train v1</dd>" in trained  # was "model —"
    assert _chart(trained).count("<polyline") == 2  # one line per device
    log = trained[trained.index('id="job-log"'):]
    assert "epoch 2/2: loss" in log[:log.index("</pre>")]  # the job's log, its child's epoch lines
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"dashboard-{workers.name}.png"
    shot.unlink(missing_ok=True)
    _chromium([f"--screenshot={shot}", page], tmp_path / "p2")
    assert shot.exists() and shot.stat().st_size > 10_000


def test_the_queue_view_orders_waiting_jobs_and_says_why(workers: Stack, api_url: str,
                                                         tmp_path: Path) -> None:
    from mxq.db import jobs
    from mxq.db.reports.queue import waiting as queued
    from mxq.priorities import Priority
    from mxq.users import local_owner

    s = workers.settings
    # The session's stack keeps the jobs earlier tests left waiting for a device no worker takes
    # (offline probes): they would fill the panel's first 20 rows ahead of the low job.
    for left in queued(s.database, 1000):
        jobs.cancel(s.database, left["id"])
    waiting = [submit(s, "probe", {"size": 16}, "cpu:7", allow_offline=True,  # no worker there
                      priority=Priority.of(level)) for level in ("low", "high")]
    try:
        dom = _chromium(["--dump-dom", api_url], tmp_path / "q").stdout
        panel = dom[dom.index('id="queue-table"'):]
        panel = panel[:panel.index("</table>")]
        low, high = (panel.index(f'href="#job={job_id}"') for job_id in waiting)
        assert high < low  # the high one runs first
        assert "no capable device: no live worker takes its queue testnode.cpu.7" in panel
        assert "priority-high" in panel and "priority-low" in panel
        table = dom[dom.index('id="jobs-table"'):]
        assert f'<td class="owner">{local_owner()}</td>' in table[:table.index("</table>")]
    finally:
        for job_id in waiting:
            jobs.cancel(s.database, job_id)


def test_the_dashboard_shows_schedules_versions_and_deliveries(workers: Stack, mlp: dict,
                                                               api_url: str, tmp_path: Path) -> None:
    """An inference schedule beside the retraining ones, mlp64's version with the prediction
    set its fire made, and the webhook delivery that job's end wrote to the outbox."""
    from mxq.db.webhooks import endpoints
    from mxq.workers.schedules.fires import run_now
    from mxq.workers.schedules.scoring import add_infer_schedule

    s = workers.settings
    hook = endpoints.add_hook(s.database, "https://hooks.example.com/dash", ["job.finished"], None)
    inbox = workers.home / "data" / "dash-inbox"
    inbox.mkdir(exist_ok=True)
    np.save(inbox / "one.npy", np.ones((40, 64), np.float32))
    add_infer_schedule(s, "dash-scores", "@every 1h", "UTC", "dash-inbox/*.npy", {"model": "mlp64"})
    try:
        run_now(s, "dash-scores")
        (job_id,) = workers.mxq_json("schedule", "show", "dash-scores")["fires"][0]["jobs"]
        assert workers.wait(job_id)["status"] == "succeeded"
        dom = _chromium(["--dump-dom", api_url], tmp_path / "p").stdout
        schedules = dom[dom.index('id="schedules-table"'):]
        row = schedules[schedules.index('data-schedule="dash-scores"'):]
        row = row[:row.index("</tr>")]
        assert '<td class="kind">infer</td>' in row and "@every 1h" in row and "dash-inbox/*.npy" in row
        versions = dom[dom.index('id="versions-table"'):]
        row = versions[versions.index('data-version="mlp64:1"'):]
        cell = row[row.index('class="sets">') + len('class="sets">'):]
        assert int(cell[:cell.index("</td>")]) >= 1  # the session's other tests score mlp64 too
        deliveries = dom[dom.index('id="deliveries-panel"'):]
        assert deliveries.index("job.finished") < deliveries.index("</table>")
    finally:
        workers.mxq("schedule", "rm", "dash-scores")
        endpoints.remove_hook(s.database, hook["id"])
