"""Choosing K GPUs closest in topology, from `nvidia-smi topo -m`: NVLink first, then the same
PCIe switch, then the same host bridge, NUMA node, and last across sockets."""

from __future__ import annotations

import itertools
import logging
import re

from mxq.workers.hardware import bounded

log = logging.getLogger(__name__)
TOPOLOGY_TIMEOUT = 20

# Lower is closer. NV# (NVLink with # links) ranks by link count, closer than any PCIe path.
PCIE_RANK = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
_NV = re.compile(r"^NV(\d+)$")


def read_topology(nvidia_smi: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m` parsed; empty (so GPUs are chosen in index order) when it fails,
    hangs or prints nothing, which a topology must never turn into a failed job."""
    try:
        proc = bounded.run([nvidia_smi, "topo", "-m"], TOPOLOGY_TIMEOUT)
    except OSError as exc:
        log.warning("nvidia-smi topo -m failed (%s): GPUs are chosen in index order", exc)
        return {}
    if proc.returncode == bounded.TIMED_OUT:
        log.warning("nvidia-smi topo -m timed out (%s): GPUs are chosen in index order", proc.stderr)
        return {}
    if proc.returncode != 0:
        log.warning("nvidia-smi topo -m exited with %s: GPUs are chosen in index order", proc.returncode)
        return {}
    return parse_topo(proc.stdout)


def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """The link between every pair of GPUs, keyed by (i, j) GPU indexes; empty for no matrix."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    gpus = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    links: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        cells = line.split()
        if len(cells) <= len(gpus) or not re.fullmatch(r"GPU\d+", cells[0]):
            continue  # not a GPU's row, or a cut one
        i = int(cells[0][3:])
        for name, cell in zip(gpus, cells[1:1 + len(gpus)], strict=True):
            j = int(name[3:])
            if i != j:
                links[(i, j)] = cell
    return links


def rank(link: str) -> int:
    if m := _NV.match(link):
        return -int(m.group(1))  # more NVLink lanes, closer
    return PCIE_RANK.get(link, 60)


def closest(links: dict[tuple[int, int], str], candidates: list[int], k: int,
            must: int | None = None, load: dict[int, int] | None = None) -> list[int]:
    """The k candidates whose worst pair link is best (ties: best sum, then the least `load` in
    all, e.g. 1 for a GPU running a job; then the lowest indexes); `must` is always in."""
    load = load or {}
    if k > len(candidates):
        raise ValueError(f"{k} GPUs wanted but only {len(candidates)} free")
    pool = sorted(c for c in candidates if c != must)  # ties (no topology) go to the lowest indexes
    best: tuple[tuple[int, int, int], list[int]] | None = None
    for combo in itertools.combinations(pool, k - (must is not None)):
        chosen = sorted([*combo, *([must] if must is not None else [])])
        scores = [rank(links.get((a, b), "SYS")) for a, b in itertools.combinations(chosen, 2)]
        key = (max(scores, default=0), sum(scores), sum(load.get(c, 0) for c in chosen))
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best else []
