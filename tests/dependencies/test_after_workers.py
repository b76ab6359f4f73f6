"""`--after` through real processes: the CLI, the launcher's two CPU workers, the reconciler,
the `mxq api` server and the Python client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mxq.client import Client
from mxq.errors import UserError
from tests.api_server import Api, start_api
from tests.conftest import Stack

TOKEN = "after-client-token-5e6f"
# A probe that fails at run time: past its one-second limit after its first round.
FAILING = ("--size", "2048", "--repeat", "1000", "--time-limit", "5")  # outlives the two submits after it


def _probe(stack: Stack, *args: str) -> int:
    done = stack.mxq_json("probe", "--device", "cpu:0", *args)
    return int(done["id"])


def test_b_after_a_starts_once_a_succeeded(workers: Stack) -> None:
    a = _probe(workers, "--size", "512", "--repeat", "20")
    b = _probe(workers, "--size", "16", "--after", str(a))
    first, then = workers.wait(a), workers.wait(b)
    assert (first["status"], then["status"]) == ("succeeded", "succeeded"), then["error"]
    assert then["after"] == [a] and (then["started_at"] or "") >= (first["finished_at"] or "~")
    shown = workers.mxq_json("job", str(b))
    assert shown["after"] == [a]


@pytest.mark.slow  # a probe that runs past its time limit
def test_a_chain_of_three_fails_down_from_its_first(workers: Stack) -> None:
    a = _probe(workers, *FAILING)
    b = _probe(workers, "--size", "16", "--after", str(a))
    c = _probe(workers, "--size", "16", "--after", str(b))
    assert workers.mxq_json("job", str(c))["waiting"].startswith(f"waits for job {b} (--after)")
    first = workers.wait(a)
    assert first["status"] == "failed" and "time limit" in (first["error"] or "")
    middle, last = workers.wait(b, timeout=30), workers.wait(c, timeout=30)
    assert middle["error"] == f"job {a} it waits for (--after) failed: {str(first['error']).splitlines()[0]}"
    assert str(last["error"]).startswith(f"job {b} it waits for (--after) failed: job {a} it waits for")
    assert middle["started_at"] is None and last["started_at"] is None


@pytest.fixture(scope="module")
def api(workers: Stack) -> Iterator[Api]:
    yield from start_api(workers, TOKEN, "api-after")


@pytest.mark.slow  # its own `mxq api` server
def test_the_client_submits_after_jobs_and_ids(workers: Stack, api: Api) -> None:
    with Client(api.url, token=TOKEN, poll_seconds=0.1) as client:
        a = client.probe(device="cpu:1", size=256)
        b = client.probe(device="cpu:1", size=16, after=[a])
        c = client.probe(device="cpu:1", size=16, after=[a.id, b])
        assert c.record["after"] == [a.id, b.id]
        assert c.wait(timeout=120).status == "succeeded"
        assert b.wait(timeout=60).status == "succeeded" and a.wait().status == "succeeded"
        with pytest.raises(UserError, match=r"--after 2147483647: no such job"):
            client.probe(device="cpu:1", after=[2**31 - 1])
        with pytest.raises(UserError):
            client.probe(device="cpu:1", after=["x"])  # the schema's: nothing recorded
