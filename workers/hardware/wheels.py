"""The NVIDIA library wheels of this environment, checked before a GPU worker starts.

The `gpu` extra's `nvidia-*-cu11` wheels and the `gpu-onnx` extra's `nvidia-*-cu12` wheels put
some of the same files in the same place (`nvidia/curand/lib/libcurand.so.10` belongs to both
`nvidia-curand-cu11` and `nvidia-curand-cu12`): installed together, uninstalling or upgrading one
deletes the other's library, and `pip check` sees nothing wrong. So the two extras never share an
environment (a mixed host runs its ONNX Runtime workers from a second one, MXQ_ONNX_PYTHON), and
the launcher refuses GPUs while a wheel's library is missing or owned twice, naming what to
reinstall. Read from the wheels' RECORD files: nothing is imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

LIBRARY_SUFFIX = ".so"


def nvidia_wheels(path: list[str] | None = None) -> list[metadata.Distribution]:
    """The installed `nvidia-*` distributions (in `path`, else this interpreter's)."""
    found = metadata.distributions(path=path) if path is not None else metadata.distributions()
    return sorted((d for d in found if (d.metadata["Name"] or "").lower().startswith("nvidia-")),
                  key=lambda d: d.metadata["Name"].lower())


def _libraries(dist: metadata.Distribution) -> list[metadata.PackagePath]:
    return [f for f in dist.files or [] if _is_library(str(f))]


def shared_files(dists: Iterable[metadata.Distribution]) -> dict[str, list[str]]:
    """Each file that more than one of `dists` installs, with their names; left out, a file all
    its owners record with the same content (each `nvidia-*-cu11` wheel ships the same empty
    `nvidia/__init__.py`), unless it is a library: one owner's removal takes it from the rest."""
    owners: dict[str, list[tuple[str, str | None]]] = {}
    for dist in dists:
        for f in dist.files or []:
            owners.setdefault(str(f), []).append((dist.metadata["Name"],
                                                  f.hash.value if f.hash else None))
    return {f: [name for name, _ in found] for f, found in owners.items()
            if len(found) > 1 and (_is_library(f) or len({h for _, h in found}) > 1)}


def _is_library(path: str) -> bool:
    return LIBRARY_SUFFIX in Path(path).name and "/lib/" in f"/{path}"


def missing_libraries(dists: Iterable[metadata.Distribution]) -> list[tuple[str, str, str]]:
    """(name, version, file) for each shared library a wheel's RECORD lists but the disk lacks."""
    gone = []
    for dist in dists:
        for f in _libraries(dist):
            if not Path(str(dist.locate_file(f))).exists():
                gone.append((dist.metadata["Name"], dist.version, str(f)))
    return gone


def problems(path: list[str] | None = None) -> list[str]:
    """Why this environment's NVIDIA wheels cannot be trusted, one line each (none: fine)."""
    dists = nvidia_wheels(path)
    said = []
    shared = shared_files(dists)
    if shared:
        first, names = sorted(shared.items())[0]
        said.append(f"the gpu and gpu-onnx extras are installed in one environment: "
                    f"{' and '.join(names)} both own {first} ({len(shared)} files are owned twice), "
                    "so removing or upgrading either deletes the other's; install gpu-onnx in an "
                    "environment of its own and point MXQ_ONNX_PYTHON at its python "
                    "(docs/gpu-hosts.md), then reinstall this one's wheels (pip install --force-reinstall "
                    "-e '.[gpu]')")
    for name, version, file in missing_libraries(dists):
        said.append(f"{file} of {name} {version} is missing (removed with another wheel that "
                    f"shared it?): pip install --force-reinstall --no-deps {name}=={version}")
    return said
