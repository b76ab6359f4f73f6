"""A real Prometheus (Debian's `prometheus`, installed by `make test-all`) scrapes a running stack's
`/metrics`, and every PromQL expression of the Grafana dashboard (deploy/grafana/dashboards/
mxq.json) returns series through Prometheus' HTTP API after a few jobs ran; `promtool check
metrics` passes on the exposition."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from mxq.errors import JobRejected
from mxq.workers.jobs.submit import submit
from tests.api_server import Api, start_api
from tests.conftest import ROOT, Stack, free_port, missing, wait_until

pytestmark = pytest.mark.slow

SCRAPE_TOKEN = "prometheus-scrape-token-5678"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "mxq.json"


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


@pytest.fixture
def api(workers: Stack, mlp: dict) -> Iterator[Api]:
    yield from start_api(workers, "prometheus-token-1234", "api-prometheus",
                         MXQ_METRICS_TOKEN=SCRAPE_TOKEN)


@pytest.fixture
def prometheus(api: Api, tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        missing("Debian's prometheus is not installed (`make test-all` installs it as root)")
    port = free_port()
    target = api.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    # As docs/sharing.md configures it: /metrics answers its scrape token (an admin's too).
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: mxq\n"
                      f"    authorization: {{type: Bearer, credentials: {SCRAPE_TOKEN}}}\n"
                      f"    static_configs:\n      - targets: ['{target}']\n")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), 60, "Prometheus to be ready", until=bool, interval=0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _query(url: str, expr: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def test_every_dashboard_expression_returns_series(workers: Stack, api: Api, prometheus: str) -> None:
    s = workers.settings
    np.save(workers.home / "data" / "prom.npy", np.ones((5000, 64), np.float32))
    jobs = [submit(s, "probe", {"size": 32, "batch": 1, "repeat": 1}, d) for d in ("cpu:0", "cpu:1")]
    jobs += [submit(s, "infer", {"model": "mlp64", "input": "prom.npy"}, d) for d in ("cpu:0", "cpu:1")]
    for job_id in jobs:
        assert workers.wait(job_id)["status"] == "succeeded"
    with pytest.raises(JobRejected):  # a failed job, for the failures panel
        submit(s, "infer", {"model": "mlp64", "input": "absent.npy"}, "cpu:0")
    wait_until(lambda: _query(prometheus, 'up{job="mxq"}'), 60, "Prometheus to scrape the API",
               until=lambda r: r and r[0]["value"][1] == "1", interval=0.5)
    expressions = dashboard_expressions()
    assert len(expressions) >= 10
    empty: dict[str, bool] = {}
    for expr in expressions:  # a rate() needs two scrapes after the jobs: wait for each
        def series(e: str = expr) -> list[dict]:
            return _query(prometheus, e)

        empty[expr] = not wait_until(series, 30, f"{expr} to return series", until=bool, interval=0.5)
    assert not any(empty.values()), empty
    print(f"prometheus: {len(expressions)} dashboard expressions evaluated, all non-empty")


def test_promtool_accepts_the_exposition(workers: Stack, api: Api) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("Debian's prometheus (promtool) is not installed")
    text = httpx.get(f"{api.url}/metrics", timeout=30,
                     headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}).text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
