"""Every SQL statement is in db/: import-linter's contract "SQL only in db/" (pyproject.toml,
checked by `make lint`) forbids SQLAlchemy, Alembic and psycopg in every other part of mxq.

These tests check the contract itself: that it names every part of the package but mxq.db (a
new module of core/ must be added to it), and that it breaks on a SQLAlchemy import outside
db/, as `make lint` runs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

CONTRACT = "SQL only in db/"


def _project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _contract() -> dict[str, Any]:
    contracts = _project()["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"] == CONTRACT)


def test_the_contract_names_every_part_of_mxq_but_db() -> None:
    folders = _project()["tool"]["setuptools"]["package-dir"]
    layers = {name for name in folders if name not in ("mxq", "mxq.db")}
    core = {f"mxq.{p.stem}" for p in (ROOT / folders["mxq"]).glob("*.py") if p.name != "__init__.py"}
    contract = _contract()
    assert set(contract["source_modules"]) == layers | core
    assert contract["type"] == "forbidden"
    assert {"sqlalchemy", "alembic", "psycopg"} <= set(contract["forbidden_modules"])



def test_the_layers_contract_puts_every_core_module_at_the_bottom() -> None:
    """core/ (the package `mxq` itself) is the lowest layer: each of its modules is listed there,
    so a new one cannot import upwards unnoticed."""
    folders = _project()["tool"]["setuptools"]["package-dir"]
    core = {p.stem for p in (ROOT / folders["mxq"]).glob("*.py") if p.name != "__init__.py"}
    contracts = _project()["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["containers"] == ["mxq"] and c["type"] == "layers")["layers"]
    assert {name.strip() for name in layers[-1].split(":")} == core

def test_a_sqlalchemy_import_in_workers_breaks_the_contract(tmp_path: Path) -> None:
    """The package laid out as `make lint` lays it out (tools/package_view.py), copied, with one
    `import sqlalchemy` added to a workers module: import-linter names that import."""
    view = subprocess.run([sys.executable, str(ROOT / "tools" / "package_view.py"), str(tmp_path / "view")],
                          check=True, capture_output=True, text=True).stdout.strip()
    copy = tmp_path / "copy"
    shutil.copytree(Path(view) / "mxq", copy / "mxq", ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "mxq" / "workers" / "repair" / "recovery.py"
    module.write_text(module.read_text() + "\nimport sqlalchemy  # noqa: E402, F401\n")
    lint = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo",
                           "--contract", _contract()["id"], str(ROOT / "pyproject.toml")],
                          cwd=copy, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert f"{CONTRACT} BROKEN" in lint.stdout
    assert "mxq.workers.repair.recovery -> sqlalchemy" in lint.stdout
