"""The environment of a GPU host without a GPU, for the install tier (`make test-gpu-install`).

The NVIDIA driver's library (`libcuda.so.1`) comes from Debian's `libcuda1` package, unpacked
under var/tools/libcuda and put on the loader path as a driver install puts it in a system folder;
nvidia-smi is a fake printing a recorded listing.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import FIXTURES, ROOT, missing

DRIVER = ROOT / "var" / "tools" / "libcuda" / "usr" / "lib" / "x86_64-linux-gnu" / "nvidia" / "current"
LISTING = FIXTURES / "nvidia-smi" / "a100-l40s-h200.csv"  # an A100, an L40S and an H200


def host_env(tmp_path: Path, python: Path, extra: str, node: str, **settings: str) -> dict[str, str]:
    """mxq's environment on such a host: the driver's folder on the loader path, the fake
    nvidia-smi, MXQ_HOME under `tmp_path`, `settings` added; skips (fails under CI) when `make
    test-gpu-install` has not built `python`'s venv (with `extra`) or unpacked the driver."""
    if not python.exists():
        missing(f"no {python}: `make test-gpu-install` builds it with the {extra} extra")
    if not (DRIVER / "libcuda.so.1").exists():
        missing(f"no libcuda.so.1 in {DRIVER}: `make test-gpu-install` unpacks Debian's libcuda1 there")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat '{LISTING}'\n")
    smi.chmod(0o755)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("MXQ_", "LD_LIBRARY_PATH", "CUDA_"))}
    return {**base, "LD_LIBRARY_PATH": str(DRIVER), "MXQ_HOME": str(tmp_path / "home"),
            "MXQ_NODE": node, "MXQ_NVIDIA_SMI": str(smi), **settings}
