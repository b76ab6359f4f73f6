"""Choosing K GPUs closest in topology, on recorded `nvidia-smi topo -m` layouts."""

from __future__ import annotations

from tests.conftest import FIXTURES
from workers.topology import closest, parse_topo

TOPO = FIXTURES / "nvidia-smi-topo"


def test_parses_links_between_gpus_only() -> None:
    links = parse_topo((TOPO / "nvlink-8gpu.txt").read_text())
    assert links[(0, 1)] == "NV4" and links[(0, 4)] == "NV2" and links[(1, 6)] == "SYS"
    assert len(links) == 8 * 7  # the NIC row and column are left out


def test_nvlink_quad_is_chosen_over_pcie() -> None:
    links = parse_topo((TOPO / "nvlink-8gpu.txt").read_text())
    assert closest(links, list(range(8)), 4, must=5) == [4, 5, 6, 7]
    assert closest(links, [0, 3, 4, 6], 2, must=3) == [0, 3]  # NV4 beats NV2 (3-4) and SYS


def test_same_pcie_switch_is_chosen_first() -> None:
    links = parse_topo((TOPO / "pcie-4gpu.txt").read_text())
    assert links[(2, 3)] == "PIX" and links[(1, 2)] == "SYS"
    assert closest(links, [0, 1, 2, 3], 2, must=2) == [2, 3]
    assert closest(links, [0, 2, 3], 2, must=0) in ([0, 2], [0, 3])  # only SYS is left
