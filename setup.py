"""Packaging's one rule that pyproject.toml cannot say: every folder under the mapped roots is a
package of the wheel.

pyproject.toml's [tool.setuptools.package-dir] maps each import name to its folder (core/ is
`mxq`, db/ is `mxq.db`, ...). setuptools' own `find` cannot prefix what it finds with a mapped
name, and a hand-kept list forgot two folders once (the installed CLI, API and schedule process
could not start), so the list is found here: each mapped folder and every folder below it, a
namespace package where it has no __init__.py (api/static holds the dashboard's page).
"""

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent


def packages() -> list[str]:
    """`mxq.<root>` for each mapped folder, and `mxq.<root>.<sub>` for every folder below it."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: list[str] = []
    for name, folder in mapping.items():
        subs = find_namespace_packages(where=str(ROOT / folder), exclude=["*__pycache__*"])
        found += [name, *(f"{name}.{sub}" for sub in subs)]
    return sorted(found)


setup(packages=packages())
