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


def test_the_running_api_meets_its_openapi_description(isolated: Stack, tmp_path: Path) -> None:
    _seed(isolated)
    for api in start_api(isolated, TOKEN, "api-contract"):
        run = subprocess.run(
            [str(Path(sys.executable).parent / "schemathesis"),
             "--config-file", str(ROOT / "tests" / "schemathesis.toml"), "--no-color",
             "run", f"{api.url}/openapi.json", "--checks", "all", "--max-examples", str(EXAMPLES),
             "--seed", str(SEED), "--header", f"Authorization: Bearer {TOKEN}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
        summary = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
        assert run.returncode == 0 and summary, run.stdout[-6000:] + run.stderr[-2000:]
        generated, passed = map(int, summary.groups())
        print(f"schemathesis: {summary.group(0)} (seed {SEED}, {EXAMPLES} examples)")  # for CI logs
        assert generated == passed and generated > 500, run.stdout[-3000:]
        assert api.proc.poll() is None, "the API died under the generated requests"
