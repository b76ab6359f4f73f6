"""mxq installs one import name, `mxq`: its wheel, installed into a fresh venv, adds nothing else.

Generic top-level names (`tasks`, `db`, `api`, `cli`, `workers`) would shadow a user's own
`tasks.py` and collide with other packages; the repository keeps those folders, and
pyproject.toml's package-dir maps them under `mxq`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

from tests.conftest import ROOT


def _build_wheel(tmp: Path) -> Path:
    """Build from a copy of what the Dockerfile copies too (pyproject.toml, README.md, the package's
    folders), so a stale build/ of the checkout cannot slip into the wheel."""
    src = tmp / "src"
    src.mkdir()
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in folders.values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--verbose",
                            "--wheel-dir", str(tmp / "dist"), str(src)],
                           check=True, capture_output=True, text=True, timeout=300)
    # A folder that setuptools sees as a package but the packages list lacks (api/static did).
    assert "is absent from the `packages` configuration" not in build.stdout + build.stderr
    return next((tmp / "dist").glob("mxq-*.whl"))


def _site_packages(env: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))


def test_the_wheel_adds_only_mxq_to_a_fresh_venv(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    env = tmp_path / "fresh"
    venv.create(env, with_pip=False)
    site = _site_packages(env)
    before = set(p.name for p in site.iterdir())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
                    "--quiet", "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    added = {p.name for p in site.iterdir()} - before
    top_level = {name for name in added if not name.endswith(".dist-info")}
    assert top_level == {"mxq"}, sorted(added)

    package = site / "mxq"
    for layer in ("api", "cli", "client", "db", "tasks", "workers"):
        assert (package / layer / "__init__.py").is_file(), layer
    assert (package / "api" / "static" / "index.html").is_file()  # the dashboard
    assert any((package / "db" / "migrations" / "versions").glob("0001_*.py"))
    assert (env / "bin" / "mxq").is_file()
    # Run from the repository root: its bare folders must not stand in for the installed package.
    probe = subprocess.run([str(env / "bin" / "python"), "-c", "import mxq, mxq.db; print(mxq.db.__file__)"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(site)
