"""The bad-input corpus's harness (tests/test_bad_input*.py): a job request case (`JobCase`, made
by `infer`, `train`, `schedule`, `probe`), run through the CLI or the HTTP API and checked: one
line naming the value, the failed job recorded or nothing, no worker gone. `client` and `pids`
are fixtures: a module that uses them imports them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from mxq.api import routes
from mxq.api.app import app
from mxq.workers.fleet.device_table import device_table
from tests.api_server import counts
from tests.conftest import FINAL, NODE, Stack, wait_until
from tests.support.messages import one_line

if TYPE_CHECKING:
    from mxq.db.records import JobRecord

TOKEN = "fault-token-Zq9x"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}

# The API of this corpus refuses inputs over 1 MB, so that limit can be tried over HTTP without
# writing gigabytes (the CLI gets the same limit for that one case through its environment).
API_MAX_INPUT_BYTES = 1_000_000
ROWS = np.random.default_rng(7).normal(size=(40, 64)).astype(np.float32)
DEVICES = ("cpu:0", "cpu:1")

# How a bad request ends:
REFUSED = "refused"  # at submit, nothing written: CLI exit 2, API 4xx without a job
REJECTED = "rejected"  # at submit, recorded as a failed job: CLI exit 1, API 422 with job_id
ON_WORKER = "on-worker"  # accepted, then failed by the worker, which goes on: CLI exit 1


def save_input(stack: Stack, name: str, array: np.ndarray) -> str:
    """`array` saved as data/`name`; the name a request gives."""
    np.save(stack.home / "data" / name, array)
    return name


def ok_input(stack: Stack) -> str:
    """A good input for mlp64 (ROWS): what a case that is not about the input sends."""
    return save_input(stack, "ok.npy", ROWS)


def input_with(value: float) -> Callable[[Stack], str]:
    """The maker of ROWS with `value` at sample 5, column 3."""
    def make(stack: Stack) -> str:
        bad = ROWS.copy()
        bad[5, 3] = value
        return save_input(stack, f"bad-{value}.npy", bad)
    return make


@dataclass(frozen=True)
class JobCase:
    """A job request: `kind` plus parameters as the API takes them (the CLI gets them as options)."""

    kind: str
    params: Callable[[Stack], dict[str, Any]]
    needle: str
    ends: str
    cli_env: dict[str, str] = field(default_factory=dict)
    channels: tuple[str, ...] = ("cli", "api")
    # How the API ends it when that differs: its typed schema refuses (422, nothing recorded)
    # parameters the CLI passes on and submit records as a failed job.
    api_ends: str | None = None

    def through_api(self) -> JobCase:
        return replace(self, ends=self.api_ends or self.ends)


def by_schema(case: JobCase) -> JobCase:
    """A case the API's schema refuses: the CLI records a failed job, the API records nothing."""
    return replace(case, api_ends=REFUSED)


def infer(input: Callable[[Stack], str] = ok_input, needle: str = "", ends: str = REJECTED,
          **opts: Any) -> JobCase:
    def params(stack: Stack) -> dict[str, Any]:
        return {"model": "mlp64", "input": input(stack), "device": "cpu:0", **opts}
    return JobCase("infer", params, needle, ends)


def train(needle: str, **opts: Any) -> JobCase:
    return JobCase("train", lambda s: {"arch": "mlp", "dataset": "digits", "name": "faulty",
                                       **opts}, needle, REJECTED)


def schedule(needle: str, **opts: Any) -> JobCase:
    return JobCase("schedule", lambda s: {"name": "faulty", "cron": "0 3 * * *", "tz": "UTC",
                                          "arch": "mlp", "dataset": "digits", "model": "faulty",
                                          **opts}, needle, REFUSED)


def probe(needle: str, ends: str = REFUSED, **opts: Any) -> JobCase:
    return JobCase("probe", lambda s: {"size": 64, **opts}, needle, ends)


def cli_args(case: JobCase, params: dict[str, Any]) -> list[str]:
    """The `mxq` command line of a case: its kind's arguments, then every other parameter as an option."""
    p = dict(params)
    if case.kind == "infer":
        head = ["infer", p.pop("model"), p.pop("input")]
    elif case.kind == "train":
        head = ["train", p.pop("arch"), p.pop("dataset"), "--name", p.pop("name")]
    elif case.kind == "schedule":
        head = ["schedule", "add", p.pop("name")]
    else:
        head = [case.kind]
    flags = []
    for key, value in p.items():
        flags += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return head + flags


@pytest.fixture(scope="module")
def client(workers: Stack) -> Iterator[TestClient]:
    """The API app in this process, with this corpus's token and input limit."""
    s = workers.settings.model_copy(update={"api_token": SecretStr(TOKEN),
                                            "max_input_bytes": API_MAX_INPUT_BYTES})
    app.dependency_overrides[routes.settings] = lambda: s
    with TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)) as test_client:
        yield test_client
    app.dependency_overrides.clear()


@pytest.fixture(scope="module")
def pids(workers: Stack, mlp: dict) -> dict[str, int]:
    """The device workers' processes at the start: the same ones must still be there after each case."""
    return live_workers(workers)


def live_workers(stack: Stack) -> dict[str, int]:
    """The PID of each live device worker of this node, by device."""
    return {device: pid for d in device_table(stack.settings)
            if d["alive"] and d["node"] == NODE
            and isinstance(device := d["device"], str) and isinstance(pid := d["pid"], int)}


def still_standing(stack: Stack, pids: dict[str, int]) -> None:
    """The launcher and the same device workers as at the start are still running."""
    assert stack.launcher is not None and stack.launcher.poll() is None, "the launcher died"
    live = live_workers(stack)
    assert set(DEVICES) <= set(live), f"a device worker is down: {live}"
    assert {d: live[d] for d in DEVICES} == {d: pids[d] for d in DEVICES}, "a device worker restarted"


def expect_changes(before: dict[str, int], after: dict[str, int], failed_jobs: int) -> None:
    """Nothing changed between the counts but `failed_jobs` more failed jobs."""
    assert after == {**before, "jobs_failed": before["jobs_failed"] + failed_jobs}, (before, after)


def run_cli_case(run: Callable[..., Any], stack: Stack, case: JobCase,
             params: dict[str, Any]) -> JobRecord | None:
    """Run the case through `run` (in-process or the real `mxq`); the failed job's record, or None
    when nothing was recorded."""
    args = cli_args(case, params)
    if case.kind != "schedule":
        args.append("--wait")
    proc = run(*args, env=case.cli_env)
    line = one_line(proc.stderr)
    assert case.needle in line, line
    if case.ends == REFUSED:
        assert proc.returncode == 2 and line.startswith("mxq: error: "), (proc.returncode, line)
        return None
    assert proc.returncode == 1, (proc.returncode, line)
    prefix = "mxq: error: job " if case.ends == REJECTED else "mxq: job "
    assert line.startswith(prefix) and " failed: " in line, line
    return stack.job(int(line.removeprefix(prefix).split()[0]))


def run_api_case(client: httpx.Client, stack: Stack, case: JobCase,
             params: dict[str, Any]) -> JobRecord | None:
    """Post the case to the API `client`; the failed job's record, or None when nothing was
    recorded (a job failed on a worker is waited for)."""
    path, body = (("/api/v1/schedules", params) if case.kind == "schedule"
                  else ("/api/v1/jobs", {"kind": case.kind, **params}))
    # json.dumps writes NaN as Python's JSON reader (and so the API) takes it; httpx would refuse
    r = client.post(path, content=json.dumps(body), headers={**AUTH, **JSON})
    answer = r.json()
    if case.ends == ON_WORKER:
        assert r.status_code == 201, answer
        job_id = answer["id"]
        done = wait_until(lambda: client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json(), 120,
                          f"job {job_id} to finish", until=lambda j: j["status"] in FINAL)
        assert case.needle in done["error"], done["error"]
        return stack.job(job_id)
    assert r.status_code == 422, (r.status_code, answer)
    assert isinstance(answer["detail"], str) and case.needle in answer["detail"], answer
    if case.ends == REFUSED:
        assert "job_id" not in answer, answer
        return None
    return stack.job(answer["job_id"])


def check_job_case(stack: Stack, pids: dict[str, int], case: JobCase,
                    run: Callable[[dict[str, Any]], JobRecord | None]) -> None:
    """Run `case` with `run` and check how it ended: refused with nothing written, or one failed
    job naming the problem; no worker gone."""
    params = case.params(stack)
    before = counts(stack)
    record = run(params)
    if case.ends == REFUSED:
        assert record is None
        expect_changes(before, counts(stack), 0)
    else:
        assert record is not None and record["status"] == "failed", record
        assert case.needle in (record["error"] or ""), record
        expect_changes(before, counts(stack), 1)
    still_standing(stack, pids)


def case_id(name: str) -> str:
    """A case's name as a test id (no spaces)."""
    return name.replace(" ", "-")
