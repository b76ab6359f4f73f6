"""Choosing K GPUs closest in topology, on recorded `nvidia-smi topo -m` layouts."""

from __future__ import annotations

from pathlib import Path

from mxq.workers.hardware.topology import closest, parse_topo, read_topology
from tests.conftest import FIXTURES

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


def test_no_matrix_falls_back_to_index_order(tmp_path: Path) -> None:
    assert parse_topo("") == {} and parse_topo("\n\n") == {}
    assert parse_topo("        GPU0    GPU1\nGPU0     X\n") == {}  # a cut row is skipped
    assert closest({}, [3, 1, 2, 0], 2, must=2) == [0, 2]
    failing = tmp_path / "nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVML: Unknown Error' >&2\nexit 255\n")
    failing.chmod(0o755)
    assert read_topology(str(failing)) == {}
    assert read_topology(str(tmp_path / "absent")) == {}
