"""The CUDA libraries of the `gpu` extra, loaded the way the `nvidia-*-cu11` wheels intend.

`libmxnet.so` of `mxnet-cu112` names libcudart, cuBLAS, cuDNN, NCCL and the rest by soname only,
and the wheels put them in their own `site-packages/nvidia/*/lib` folders, which the dynamic
loader does not search. Loading each by absolute path with RTLD_GLOBAL first (as other frameworks
load their CUDA wheels) makes the soname lookups of `import mxnet` find them in any process, with
no LD_LIBRARY_PATH. On a CPU install (no `nvidia` wheels) this loads nothing. No MXNet import here.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

# What libmxnet.so needs, dependencies first (cuBLAS needs cuBLASLt; cuSOLVER needs cuBLAS).
LIBRARIES = ("cudart", "cublasLt", "cublas", "cufft", "curand", "cusolver", "nvrtc", "nvToolsExt",
             "nccl", "cudnn")


def lib_dirs() -> list[Path]:
    """The `lib` folders of the installed `nvidia-*-cu11` wheels."""
    try:
        import nvidia  # namespace package of the nvidia-*-cu11 wheels
    except ImportError:
        return []
    return sorted(p for root in nvidia.__path__ for p in Path(root).glob("*/lib") if p.is_dir())


def _find(name: str, dirs: list[Path]) -> Path | None:
    """`lib<name>.so.<major>` in the wheels' folders (the versioned file the soname names)."""
    found = sorted(p for d in dirs for p in d.glob(f"lib{name}.so.*") if p.name.count(".so.") == 1)
    return found[0] if found else None


@cache
def load_cuda_libraries() -> list[str]:
    """Load the wheels' CUDA libraries globally, once per process; the paths loaded."""
    dirs = lib_dirs()
    loaded = []
    for name in LIBRARIES:
        path = _find(name, dirs)
        if path is not None:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            loaded.append(str(path))
    return loaded
