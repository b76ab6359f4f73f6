"""The GPU code a CUDA build of MXNet carries, and CUDA's rule for which GPUs can run it.

`libmxnet.so` keeps its kernels in the `.nv_fatbin` section: fat binaries, each a list of
entries that are either SASS (a cubin for one compute capability) or PTX (which the driver
compiles for the GPU it finds, at or above its version). `read_kernels` lists them as
`cuobjdump --list-elf/--list-ptx` does, by reading only the entry headers, without importing MXNet
and without CUDA installed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import BinaryIO

FATBIN_MAGIC = 0xBA55ED50
SASS, PTX = 2, 1  # entry kinds of a fat binary


@dataclass(frozen=True)
class BuildKernels:
    """SASS and PTX compute capabilities (major*10+minor) of one MXNet build."""

    version: str
    sass: tuple[int, ...]
    ptx: tuple[int, ...] = ()

    def runs_on(self, sm: int) -> bool:
        """CUDA's rule: SASS runs on GPUs of the same major version with an equal or higher
        minor; PTX is compiled by the driver for any GPU at or above its version."""
        return (any(s // 10 == sm // 10 and s <= sm for s in self.sass)
                or any(p <= sm for p in self.ptx))

    def span(self) -> str:
        """The compute capabilities it runs on, as a user reads them: `5.0 to 8.9`."""
        low = min((*self.sass, *self.ptx))
        top = "any newer" if self.ptx else f"{max(self.sass) // 10}.9"
        return f"{low // 10}.{low % 10} to {top}"


# What read_kernels finds in libmxnet.so of each pinned CUDA build (the GPU-install tests check
# it against the installed binary); used where that build is named but not installed.
RECORDED: dict[str, BuildKernels] = {
    "mxnet-cu112": BuildKernels("1.9.1", sass=(50, 60, 70, 80, 86)),
}


def _section(f: BinaryIO, wanted: str) -> tuple[int, int] | None:
    """(offset, size) of the ELF64 section named `wanted`, or None."""
    head = f.read(64)
    if head[:4] != b"\x7fELF" or head[4] != 2:
        return None
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
    names_at, names_size = sections[shstrndx][4:6]
    f.seek(names_at)
    names = f.read(names_size)
    for name, _, _, _, offset, size in sections:
        if names[name:names.index(b"\0", name)].decode() == wanted:
            return offset, size
    return None


def _entries(f: BinaryIO, start: int, end: int) -> list[tuple[int, int]]:
    """(kind, sm) of every entry of every fat binary between `start` and `end`."""
    found, pos = [], start
    while pos + 16 <= end:
        f.seek(pos)
        magic, _, header_size, body_size = struct.unpack("<IHHQ", f.read(16))
        if magic != FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned, with padding between them
            continue
        entry, stop = pos + header_size, pos + header_size + body_size
        while entry < stop:
            f.seek(entry)
            kind, _, entry_header, entry_size, _, _, _, _, arch = struct.unpack("<HHIQIIHHI", f.read(32))
            found.append((kind, arch))
            entry += entry_header + entry_size
        pos = stop
    return found


def read_kernels(library: Path, version: str = "") -> BuildKernels | None:
    """The SASS and PTX a CUDA library carries; None when it has no fat binary."""
    with open(library, "rb") as f:
        where = _section(f, ".nv_fatbin")
        if where is None:
            return None
        entries = _entries(f, where[0], where[0] + where[1])
    sass = tuple(sorted({sm for kind, sm in entries if kind == SASS}))
    ptx = tuple(sorted({sm for kind, sm in entries if kind == PTX}))
    return BuildKernels(version, sass, ptx) if sass or ptx else None


def installed_kernels(build: str) -> BuildKernels | None:
    """What the installed `build`'s libmxnet.so carries, read from it; None when it is not
    installed or cannot be read."""
    try:
        dist = metadata.distribution(build)
        library = Path(str(dist.locate_file("mxnet/libmxnet.so")))
        return read_kernels(library, dist.version) if library.is_file() else None
    except (metadata.PackageNotFoundError, OSError, struct.error, ValueError):
        return None


@cache
def kernels_of(build: str) -> BuildKernels | None:
    """What `build` carries: read from its installed libmxnet.so, else as recorded."""
    return installed_kernels(build) or RECORDED.get(build)
