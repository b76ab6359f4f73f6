"""The CLI starts fast: `import mxq.cli.main` and `mxq --help` load none of the heavy libraries,
and a command loads only what it uses (`mxq jobs` reads SQL: no broker client, no NumPy).

Each command imports its libraries when it runs (cli/main.py); a module-level import of one of
these in any CLI module, or in what they import at the top, fails here. Times are measured in the
closing notes, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

HEAVY = {"sqlalchemy", "alembic", "celery", "kombu", "redis", "numpy", "pyarrow", "sklearn",
         "mxnet", "onnx", "onnxruntime", "fastapi", "uvicorn", "pydantic_settings", "httpx"}
# Run `mxq ARGS` in a fresh interpreter and print, at exit, the heavy top-level modules it loaded.
PROBE = """
import atexit, json, sys
heavy = set(json.loads(sys.argv[1]))
atexit.register(lambda: print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & heavy)),
                              file=sys.stderr))
from mxq.cli.main import main
main(sys.argv[2:])
"""


def _loaded(args: list[str], home: Path) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(sorted(HEAVY)), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "MXQ_HOME": str(home)})
    assert proc.returncode in (0, 2), proc.stderr
    return set(json.loads(proc.stderr.strip().splitlines()[-1]))


def test_importing_the_cli_loads_no_heavy_library(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import json, sys, mxq.cli.main; "
                           "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) & HEAVY == set()


@pytest.mark.parametrize("args", [["--help"], ["infer", "--help"], ["jobs", "--help"],
                                  ["models", "--help"], ["schedule", "add", "--help"]],
                         ids=" ".join)
def test_help_loads_no_heavy_library(tmp_path: Path, args: list[str]) -> None:
    assert _loaded(args, tmp_path) == set()


def test_reading_history_loads_only_sql(tmp_path: Path) -> None:
    assert subprocess.run([sys.executable, "-m", "mxq.cli", "migrate"], cwd=ROOT, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "MXQ_HOME": str(tmp_path)},
                          capture_output=True).returncode == 0
    for args in (["jobs"], ["models"], ["schedule", "list"], ["stats"]):
        assert _loaded(args, tmp_path) == {"sqlalchemy", "pydantic_settings"}, args
