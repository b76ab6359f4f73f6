"""Print the key of what an environment of this checkout installs: a hash of the Python that runs
it and of pyproject.toml's tables that decide the install ([build-system] and [project]: the
dependencies and extras, pinned). CI (.ci/run) reuses an environment made for the same key, so a
change to pyproject.toml's tool settings (pytest's, mypy's) does not install everything again.

Usage: python3.11 tools/install_key.py
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def install_key() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    what = [sys.version, project["build-system"], project["project"]]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


if __name__ == "__main__":
    print(install_key())
