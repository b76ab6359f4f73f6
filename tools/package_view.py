"""Lay the package `mxq` out as one folder of links, for tools that read packages from disk.

pyproject.toml's package-dir maps `mxq` to core/ and its layers to the top-level folders
(`mxq.db` is db/, ...). Python follows that mapping (the installed wheel, or setuptools' finder in
an editable install), but the type checker and import-linter walk folders: they get this view,
`var/view/mxq/`, whose entries are links to the real files and folders, so what they report is
the code itself. Run again after adding a file to core/.

Usage: python tools/package_view.py [VIEW_ROOT]   (default var/view)
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, Path]:
    """`{"mxq": core/, "mxq.db": db/, ...}` from pyproject.toml, as absolute paths."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: ROOT / folder for name, folder in project["tool"]["setuptools"]["package-dir"].items()}


def build(view: Path) -> Path:
    dirs = package_dirs()
    package = view / "mxq"
    shutil.rmtree(package, ignore_errors=True)  # the tools' caches beside it stay
    package.mkdir(parents=True)
    for entry in dirs.pop("mxq").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in dirs.items():
        head, _, layer = name.partition(".")
        if head != "mxq" or not layer or "." in layer:
            raise SystemExit(f"package-dir entry {name!r}: expected mxq.LAYER")
        (package / layer).symlink_to(folder)
    return view


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "var" / "view"))
