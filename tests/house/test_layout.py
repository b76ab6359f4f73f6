"""The house rules of the source tree: a folder is small enough to read as one concept, and says
what it holds and what of mxq it imports (a line `Imports (of mxq): core, db, workers.settings.`
in its docstring, checked against its modules' imports, lazy ones included).

A folder of more than 15 modules is a sign that it holds several concepts (workers/ held 34 before
it was split by concept). Alembic's revisions (db/migrations/versions) are exempt: they are a
history, read one at a time, never a concept.
"""

from __future__ import annotations

import ast
import re
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


# Fixtures are data, not packages (tests/fixtures/nvml: a fake `pynvml` put on a worker's path).
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.mark.parametrize("folder", [f for f in _folders() if FIXTURES not in (f, *f.parents)],
                         ids=lambda f: str(f.relative_to(ROOT)))
def test_a_package_says_what_it_holds(folder: Path) -> None:
    init = folder / "__init__.py"
    assert init.is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"
    assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)} has no docstring"


# The Python package of each top-level folder (pyproject.toml's package-dir).
PACKAGES = {"core": "mxq", "db": "mxq.db", "workers": "mxq.workers", "tasks": "mxq.tasks",
            "api": "mxq.api", "cli": "mxq.cli", "client": "mxq.client"}
CORE = {p.stem for p in (ROOT / "core").glob("*.py")} - {"__init__"}


def _short(name: str) -> str:
    """`mxq.workers.jobs.submit` as a docstring names it (`workers.jobs.submit`); core's modules
    (`mxq.errors`) are `core`."""
    rest = name.split(".")[1:]
    return "core" if not rest or rest[0] in CORE else ".".join(rest)


def _imported(folder: Path) -> set[str]:
    """What the folder's own modules import of mxq outside the folder (its subfolders are its own)."""
    rel = folder.relative_to(ROOT)
    me = _short(".".join([PACKAGES[rel.parts[0]], *rel.parts[1:]]))
    found = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found |= {_short(n) for n in names if n == "mxq" or n.startswith("mxq.")}
    return {n for n in found if n != me and not n.startswith(f"{me}.") and not (me == "core" == n)}


def _declared(folder: Path) -> list[str] | None:
    return _listed(ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or "")


def _listed(doc: str) -> list[str] | None:
    """The names of an `Imports (of mxq): a, b (why), c.` sentence; [] for `none ...`; None
    without one."""
    line = re.sub(r"\s*\([^)]*\)", "", " ".join(doc.split()).partition("Imports (of mxq): ")[2])
    if not line:
        return None
    if line.startswith("none"):
        return []
    return [d.strip() for d in line.split(". ")[0].rstrip(".").split(",")]


@pytest.mark.parametrize("folder", [ROOT / f for f in PACKAGES] + sorted(
    f for f in _folders() if f.relative_to(ROOT).parts[0] in PACKAGES and f.parent != ROOT),
    ids=lambda f: str(f.relative_to(ROOT)))
def test_a_package_says_what_of_mxq_it_imports(folder: Path) -> None:
    declared = _declared(folder)
    assert declared is not None, f"{folder.relative_to(ROOT)}/__init__.py does not say what of mxq " \
                                 "it imports (`Imports (of mxq): core, db.`)"
    beyond = sorted(n for n in _imported(folder)
                    if not any(n == d or n.startswith(f"{d}.") for d in declared))
    assert not beyond, f"{folder.relative_to(ROOT)} imports {beyond}, beyond what its docstring " \
                       f"says: {declared}"


def test_the_imports_sentence_is_read_as_written() -> None:
    assert _listed("Jobs.\n\nImports (of mxq): core, db (its\nrecords), workers.settings.") == \
        ["core", "db", "workers.settings"]
    assert _listed("Imports (of mxq): none of mxq's layers (they import it).") == []
    assert _listed("No such sentence.") is None


def test_the_rules_see_a_crowded_folder(tmp_path: Path) -> None:
    for n in range(MOST_MODULES + 1):
        (tmp_path / f"m{n}.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    assert len(_modules(tmp_path)) == MOST_MODULES + 1
