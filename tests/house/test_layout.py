"""The house rules of the source tree: a folder is small enough to read as one concept, and says
what it holds.

A folder of more than 15 modules is a sign that it holds several concepts (workers/ held 34 before
it was split by concept). Alembic's revisions (db/migrations/versions) are exempt: they are a
history, read one at a time, never a concept.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

MOST_MODULES = 15
EXEMPT = {ROOT / "db" / "migrations" / "versions"}


def _source_roots() -> list[Path]:
    """The package's folders (pyproject.toml's package-dir), the benchmarks and the tests."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return [ROOT / folder for folder in dirs.values()] + [ROOT / "bench", ROOT / "tests"]


def _folders() -> list[Path]:
    found = set()
    for root in _source_roots():
        found |= {path.parent for path in root.rglob("*.py") if "__pycache__" not in path.parts}
    return sorted(found - EXEMPT)


def _modules(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "conftest.py"))


@pytest.mark.parametrize("folder", _folders(), ids=lambda f: str(f.relative_to(ROOT)) or ".")
def test_a_folder_holds_at_most_15_modules(folder: Path) -> None:
    modules = _modules(folder)
    assert len(modules) <= MOST_MODULES, (
        f"{folder.relative_to(ROOT)} holds {len(modules)} modules (at most {MOST_MODULES}): split it by "
        f"concept into subpackages: {modules}")


@pytest.mark.parametrize("folder", [f for f in _folders() if f != ROOT / "tests" / "fixtures"],
                         ids=lambda f: str(f.relative_to(ROOT)))
def test_a_package_says_what_it_holds(folder: Path) -> None:
    init = folder / "__init__.py"
    assert init.is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"
    assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)} has no docstring"


def test_the_rules_see_a_crowded_folder(tmp_path: Path) -> None:
    for n in range(MOST_MODULES + 1):
        (tmp_path / f"m{n}.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    assert len(_modules(tmp_path)) == MOST_MODULES + 1
