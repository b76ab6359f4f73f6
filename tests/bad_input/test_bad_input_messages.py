"""The bad-input corpus's cases for messages that name the real cause (issue 29, items 5 and 8):
bodies the JSON parser refuses for nesting or digits, device lists, relative paths that do not
exist. Each through the API in this process (and the job cases through the CLI too), answered in
one line naming what, which value and what is allowed, with every worker still standing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api_server import counts
from tests.conftest import Stack
from tests.support.bad_input import (
    AUTH,
    JSON,
    REFUSED,
    REJECTED,
    JobCase,
    case_id,
    check_job_case,
    expect_changes,
    infer,
    run_api_case,
    run_cli_case,
    schedule,
    still_standing,
)
from tests.support.bad_input import client as client  # a fixture: the API app in this process
from tests.support.bad_input import pids as pids  # a fixture: the workers at the start

pytestmark = pytest.mark.both_legs

DEEP = "JSON nested deeper than 500 levels"
DIGITS = "a number of more than 4300 digits (the most an integer may have)"
BODY = {**AUTH, **JSON}
# (method, path, body bytes, status, what the detail says)
PARSER_CASES: dict[str, tuple[str, str, bytes, int, str]] = {
    "job body nested 100000 deep": ("POST", "/api/v1/jobs", b"[" * 100_000 + b"]" * 100_000, 422, DEEP),
    "job body with objects nested 100000 deep": (
        "POST", "/api/v1/jobs", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 422, DEEP),
    "job field nested 2000 deep": ("POST", "/api/v1/jobs", b'{"kind": "probe", "size": '
                                   + b"[" * 2000 + b"]" * 2000 + b"}", 422, DEEP),
    "schedule body nested 100000 deep": ("POST", "/api/v1/schedules",
                                         b"[" * 100_000 + b"]" * 100_000, 422, DEEP),
    "probe size of 5000 digits": ("POST", "/api/v1/jobs",
                                  b'{"kind": "probe", "size": ' + b"9" * 5000 + b"}", 422, DIGITS),
    "negative batch of 5000 digits": ("POST", "/api/v1/jobs", b'{"kind": "infer", "model": "mlp64", '
                                      b'"input": "ok.npy", "batch_size": -' + b"1" * 5000 + b"}",
                                      422, DIGITS),
    "schedule epochs of 5000 digits": ("POST", "/api/v1/schedules", b'{"name": "x", "cron": "0 3 * * *", '
                                       b'"dataset": "d.npz", "model": "m", "arch": "mlp", "epochs": '
                                       + b"7" * 5000 + b"}", 422, DIGITS),
    "promote version of 5000 digits": ("POST", "/api/v1/models/mlp64/promote",
                                       b'{"version": ' + b"3" * 5000 + b"}", 422, DIGITS),
}


@pytest.mark.parametrize("case", list(PARSER_CASES), ids=case_id)
def test_a_body_the_json_parser_refuses_names_why(workers: Stack, client: TestClient,
                                                   pids: dict[str, int], case: str) -> None:
    method, path, content, status, said = PARSER_CASES[case]
    before = counts(workers)
    r = client.request(method, path, content=content, headers=BODY)
    assert r.status_code == status, r.text
    assert r.json()["detail"] == f"malformed JSON body: {said}"
    expect_changes(before, counts(workers), 0)
    still_standing(workers, pids)


def _train(device: str | None = None, **opts: Any) -> dict[str, Any]:
    return {"arch": "mlp", "dataset": "digits", "name": "faulty", **opts,
            **({"device": device} if device else {})}


MESSAGE_JOB_CASES: dict[str, JobCase] = {
    "relative input that does not exist": infer(
        lambda s: "./nothing-here.npy", "input ./nothing-here.npy does not exist (looked for "),
    "relative input climbing back in": infer(
        lambda s: "sub/../gone.npy", "a relative path counts from the data root"),
    "a device listed twice": JobCase("train", lambda s: _train("cpu:0,cpu:0"),
                                     "--device lists a device twice: cpu:0,cpu:0", REJECTED,
                                     channels=("cli",)),
    "devices of two kinds": JobCase("train", lambda s: _train("cpu:0,gpu:0"),
                                    "--device cpu:0,gpu:0 mixes device kinds", REJECTED,
                                    channels=("cli",)),
    "a device listed twice (API)": JobCase("train", lambda s: _train(device_list=["cpu:1", "cpu:1"]),
                                           "invalid request: --device lists a device twice: cpu:1,cpu:1",
                                           REFUSED, channels=("api",)),
    "devices of two kinds (API)": JobCase("train", lambda s: _train(device_list=["gpu:0", "cpu:0"]),
                                          "invalid request: --device gpu:0,cpu:0 mixes device kinds",
                                          REFUSED, channels=("api",)),
    "schedule devices of two kinds": replace(schedule("--device cpu:0,gpu:0 mixes device kinds",
                                                      device="cpu:0,gpu:0"), channels=("cli",)),
    "schedule devices of two kinds (API)": replace(schedule(
        "invalid request: --device gpu:1,cpu:1 mixes device kinds", device_list=["gpu:1", "cpu:1"]),
        channels=("api",)),
}


@pytest.mark.parametrize("channel,case", [pytest.param(ch, name, id=f"{ch}-{case_id(name)}")
                                          for name, c in MESSAGE_JOB_CASES.items() for ch in c.channels])
def test_a_message_names_the_real_cause(workers: Stack, client: TestClient,
                                        pids: dict[str, int], channel: str,
                                        case: str) -> None:
    c = MESSAGE_JOB_CASES[case]
    if channel == "cli":
        check_job_case(workers, pids, c, lambda p: run_cli_case(workers.mxq, workers, c, p))
    else:
        c = c.through_api()
        check_job_case(workers, pids, c, lambda p: run_api_case(client, workers, c, p))
