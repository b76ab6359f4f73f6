"""What ships is what is tested: the wheel users install (the Dockerfile installs it, not the
source tree) holds every module of the tree, adds one import name, `mxq`, and runs.

Generic top-level names (`tasks`, `db`, `api`, `cli`, `workers`) would shadow a user's own
`tasks.py` and collide with other packages; the repository keeps those folders, and
pyproject.toml's package-dir maps them under `mxq` (setup.py finds every folder below them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

# What the Dockerfile copies to build mxq: the metadata, the readme it names, the package's folders.
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md")
# Scripts that another program runs, not modules to import: Alembic executes its env.py.
SCRIPTS = {"mxq.db.migrations.env"}


def _package_dir() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def product_modules() -> list[str]:
    """Every module of the source tree by the name it has installed (db/schedules/claims.py is
    mxq.db.schedules.claims): read from the folders, not from any packaging list."""
    names: list[str] = []
    for name, folder in _package_dir().items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if "__pycache__" in parts or parts[-1] == "__main__":
                continue
            names.append(".".join((name, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


def _build_wheel(tmp: Path) -> Path:
    """Build from a copy of what the Dockerfile copies too (pyproject.toml, README.md, the package's
    folders), so a stale build/ of the checkout cannot slip into the wheel."""
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_FILES:
        shutil.copy(ROOT / name, src / name)
    for folder in _package_dir().values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--verbose",
                            "--wheel-dir", str(tmp / "dist"), str(src)],
                           check=True, capture_output=True, text=True, timeout=300)
    # A folder that setuptools sees as a package but the packages list lacks (api/static did).
    assert "is absent from the `packages` configuration" not in build.stdout + build.stderr
    return next((tmp / "dist").glob("mxq-*.whl"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for the module's tests."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def _site_packages(env: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))


def test_the_wheel_adds_only_mxq_to_a_fresh_venv(tmp_path: Path, wheel: Path) -> None:
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


def test_the_wheel_holds_every_module_of_the_tree(wheel: Path) -> None:
    """A folder left out of packaging (mxq.db.lineage and mxq.cli.pipelines once were) is a module
    missing from the wheel, whatever the editable install the other tests run makes of it."""
    shipped = set(zipfile.ZipFile(wheel).namelist())
    paths = {m: m.replace(".", "/") for m in product_modules()}
    missing = [m for m, path in paths.items()
               if f"{path}.py" not in shipped and f"{path}/__init__.py" not in shipped]
    assert not missing, f"the wheel lacks {missing}"


def _installed(tmp: Path, wheel: Path) -> Path:
    """A fresh venv with the wheel and the `cpu` extra installed the way the Dockerfile installs
    them: from the index (or pip's cache), no editable path, no source tree."""
    env = tmp / "installed"
    venv.create(env, with_pip=False)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
                          "--quiet", "--disable-pip-version-check", f"{wheel}[cpu]"],
                         capture_output=True, text=True, timeout=1200)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return env


def _clean_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: no MXQ_* or PYTHON* setting of the test session's."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MXQ_", "PYTHON", "VIRTUAL_ENV"))}
    return {**keep, "MXQ_HOME": str(home), "MXQ_DATA_ROOT": str(home / "data"), "MXQ_CPU_DEVICES": "1",
            "MXQ_NVIDIA_SMI": str(home / "absent"), "MXQ_API_PORT": str(free_port())}


@pytest.mark.slow
def test_the_installed_wheel_imports_every_module_and_runs_a_job(tmp_path: Path, wheel: Path) -> None:
    """Installed from the wheel alone, every product module imports from the venv (python -I: no
    source tree on sys.path), and its `mxq` starts a stack, runs a probe and stops."""
    env = _installed(tmp_path, wheel)
    python, mxq = env / "bin" / "python", env / "bin" / "mxq"
    site = _site_packages(env)
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = ("import importlib, json, sys\n"
              "bad = {}\n"
              "for name in sys.argv[1:]:\n"
              "    try:\n"
              "        m = importlib.import_module(name)\n"
              "        if not m.__file__.startswith(" + repr(str(site)) + "): bad[name] = m.__file__\n"
              "    except Exception as exc:\n"
              "        bad[name] = f'{type(exc).__name__}: {exc}'\n"
              "print(json.dumps(bad))\n")
    modules = [m for m in product_modules() if m not in SCRIPTS]
    imported = subprocess.run([str(python), "-I", "-c", script, *modules], cwd=work,
                              capture_output=True, text=True, timeout=600)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert json.loads(imported.stdout.strip().splitlines()[-1]) == {}, f"of {len(modules)} modules"

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    shell = _clean_env(home)

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(mxq), *args], cwd=work, env=shell, capture_output=True, text=True,
                              timeout=timeout)

    assert "Usage" in run("--help").stdout
    try:
        up = run("up", "--detach")
        assert up.returncode == 0, up.stderr
        probe = run("probe", "--device", "cpu:0", "--size", "64", "--repeat", "1", "--wait", "--json")
        assert probe.returncode == 0, probe.stdout + probe.stderr
        job = json.loads(probe.stdout)
        assert job["status"] == "succeeded" and job["device"] == "cpu:0", job
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
