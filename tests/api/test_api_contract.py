"""The HTTP API is what its OpenAPI description says: Schemathesis (the property-based API tester)
runs every check it has (`--checks all`: status codes, content types, response schemas, headers,
schema-valid requests accepted, schema-violating ones refused, `Allow` on 405, auth enforced)
against a real `mxq api` process on loopback, with a token set, over generated cases of every
operation; any failure fails the test. tests/schemathesis.toml holds its one allowance."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api_server import start_api
from tests.conftest import ROOT, Stack

pytestmark = pytest.mark.both_legs  # what a hostile string does to a query differs by backend

TOKEN = "contract-token-5f1c9e2a"
EXAMPLES = 25  # per operation and phase: about 1,500 cases in all, some 20 s
SEED = 1  # the same cases every run; a failure prints how to replay it


def _seed(stack: Stack) -> None:
    """Something to find: a model and a schedule, so that not every named lookup is a 404."""
    for args in (["models", "add", "mlp64", "--arch", "mlp", "--input-shape", "64"],
                 ["schedule", "add", "nightly", "--cron", "0 3 * * *", "--arch", "mlp",
                  "--dataset", "nothing/*.npz", "--model", "nightly"]):
        proc = stack.mxq(*args)
        assert proc.returncode == 0, proc.stderr


def _schemathesis(url: str, token: str, checks: str, cwd: Path) -> tuple[int, int]:
    """Run Schemathesis against `url` with `token`; (generated, passed), after asserting it passed."""
    run = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"),
         "--config-file", str(ROOT / "tests" / "schemathesis.toml"), "--no-color",
         "run", f"{url}/openapi.json", "--checks", checks, "--max-examples", str(EXAMPLES),
         "--seed", str(SEED), "--header", f"Authorization: Bearer {token}"],
        cwd=cwd, capture_output=True, text=True, timeout=600)
    summary = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert run.returncode == 0 and summary, run.stdout[-6000:] + run.stderr[-2000:]
    generated, passed = map(int, summary.groups())
    print(f"schemathesis ({checks}): {summary.group(0)} (seed {SEED}, {EXAMPLES} examples)")  # for CI logs
    assert generated == passed and generated > 500, run.stdout[-3000:]
    return generated, passed


@pytest.mark.slow  # about 50 s of Schemathesis against the real server: make test-all (CI)
def test_the_running_api_meets_its_openapi_description(isolated: Stack, tmp_path: Path) -> None:
    """With the admin's token, every check; with a `read` user's token (which every write
    refuses, 403, and whose reads of others' results are refused too) no 5xx anywhere."""
    _seed(isolated)
    reader = isolated.mxq_json("users", "add", "contract-reader", "--role", "read")["token"]
    for api in start_api(isolated, TOKEN, "api-contract"):
        _schemathesis(api.url, TOKEN, "all", tmp_path)
        _schemathesis(api.url, reader, "not_a_server_error", tmp_path)
        assert api.proc.poll() is None, "the API died under the generated requests"
