"""The fleet benchmark's quick variant (10 and 30 simulated devices, a thousand jobs, a history
of 50,000): every job runs to its end exactly once through killed devices and a broker
restart. Figures are written, never judged here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench.__main__ import SIZES
from tests.conftest import SYSTEM_PG, missing

# One benchmark at a time in a run: they share the machine's Redis database 0 and measure the cores.
pytestmark = pytest.mark.xdist_group("benchmarks")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_fleet_loses_and_repeats_nothing(tmp_path: Path) -> None:
    try:
        psycopg.connect(SYSTEM_PG, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        missing(f"no PostgreSQL at {SYSTEM_PG}: {exc}")
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "fleet", "--out", str(out),
                           "--postgres", SYSTEM_PG], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    case = json.loads((out / "results.json").read_text())["cases"]["fleet"]
    assert case["status"] == "ok", case
    sizes = case["result"]["by_devices"]
    assert set(sizes) == {str(n) for n in SIZES["fleet"]["quick"]["devices"]}
    for n, f in sizes.items():
        assert f["lost"] == 0, (n, f["lost_jobs"], f["statuses"])
        assert f["duplicated"] == 0, n
        assert f["statuses"] == {"succeeded": f["finished"]}, (n, f["statuses"])  # drained, all ran
        assert len(f["faults"]) == 3, f["faults"]  # killed, restarted, broker restarted
        assert f["counters"].get("reconnects", 0) > 0, n  # the broker restart was felt
        for key in ("claim_p99_ms", "reconcile_pass_s", "history_p95_ms", "api_jobs_p95_ms"):
            assert f[key] > 0, (n, key)
    report = (out / "report.md").read_text()
    assert "](fleet.png)" in report and "| devices | jobs |" in report
    assert (out / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_cut_off_by_its_devices_death_counts_once_either_way() -> None:
    """The killed device's last line is `done`: its outcome may or may not have been recorded
    before the kill. Run again elsewhere, it was not (a rerun); never run again, it was (CI once
    judged such a succeeded job lost)."""
    from bench.fleet.case import _completions

    def line(event: str, job: int, worker: str, killed: bool) -> dict[str, object]:
        return {"e": event, "job": job, "w": worker, "killed": killed}

    entries = [line("done", 1, "v0", True), line("ran", 1, "v0", True), line("done", 7, "v0", True),
               line("done", 8, "v1", True),  # both cut off by the kill
               line("done", 8, "p0", False), line("done", 9, "p0", False), line("done", 9, "p1", False)]
    done, reruns = _completions(entries)
    assert dict(done) == {1: 1, 7: 1, 8: 1, 9: 2}  # 7 recorded before the kill, 8 ran again
    assert reruns == 1
