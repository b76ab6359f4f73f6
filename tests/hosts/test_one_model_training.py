"""A multi-device training runs on GPUs of one model (issue 45, item 6).

Data parallel steps at the pace of its slowest device: a `--devices 2` training that an L4 took
trained on the L4 and an A100 (ties went to the lowest index), and the A100 waited for the L4
every step. Now the leader pairs itself only with GPUs of its own model (nvidia-smi's name on
the worker rows), the closest in `nvidia-smi topo -m`, then the least loaded. A leader whose
model the node has too few of hands a pool job back (admit defers it: the job goes back to its
pool, where a worker of a model the node has enough of takes it); a job pinned to that leader
fails, naming each model's devices. Too few of the model free now: the job waits, as for busy
devices; it never takes a mixed set. Only a device list the user names may mix models.
No GPU exists here: the workers are rows as their heartbeat writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mxq.db.fleet import beat, register
from mxq.tasks.job_context import JobContext, JobInputError
from mxq.tasks.training import train_task
from mxq.tasks.training.dist import choose_nodes
from mxq.tasks.training.train_task import choose_devices
from mxq.workers.fleet import leases
from mxq.workers.hardware.topology import closest
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.settings import Settings
from tests.conftest import FIXTURES, NODE, Stack

pytestmark = pytest.mark.both_legs

L4 = {"name": "NVIDIA L4", "compute_cap": "8.9"}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "compute_cap": "8.0"}
TRAIN: dict[str, Any] = {"arch": "mlp", "dataset": "digits", "name": "onemodel", "epochs": 1}
TWO = TrainParams(**{**TRAIN, "devices": 2})


def _node(stack: Stack, tmp_path: Path, *models: dict[str, str], busy: tuple[int, ...] = (),
          topo: str | None = None) -> Settings:
    """gpu:i of `models[i]`, each running MXNet; `busy` ones running a job; `topo` the
    recorded `nvidia-smi topo -m` its nvidia-smi prints (none: the program is absent)."""
    s = stack.settings
    for index, info in enumerate(models):
        register(s.database, f"gpu{index}@{NODE}", NODE, f"gpu:{index}", f"{NODE}.gpu.{index}",
                 None, info, engines=("mxnet", "onnx"))
    for index in busy:
        beat(s.database, f"gpu{index}@{NODE}", 9000 + index)
    smi = tmp_path / "absent"
    if topo is not None:
        smi = tmp_path / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\ncat '{FIXTURES / 'nvidia-smi-topo' / topo}'\n")
        smi.chmod(0o755)
    return s.model_copy(update={"nvidia_smi": str(smi)})


def _job(s: Settings, device: str, queue: str, job_id: int = 1) -> JobContext:
    return JobContext(job_id, "train", {**TRAIN, "devices": 2}, device, s, queue, "auto:gpu", None)


def test_an_a100_pairs_with_the_other_a100_not_the_l4_before_it(isolated: Stack,
                                                               tmp_path: Path) -> None:
    """It took gpu:0 (the L4), the lowest index of equally close GPUs."""
    s = _node(isolated, tmp_path, L4, A100, A100)
    assert choose_devices(s, TWO, "gpu:1", movable=True) == ["gpu:1", "gpu:2"]
    assert choose_devices(s, TWO, "gpu:2") == ["gpu:2", "gpu:1"]


def test_the_l4_hands_a_pool_training_to_the_a100s(isolated: Stack, tmp_path: Path) -> None:
    """The L4 that took a 2-device training from the pool has no second L4: its admit defers the
    job (it goes back to the pool) rather than leasing the L4 and an A100; an A100 that takes it
    leases both A100s."""
    s = _node(isolated, tmp_path, L4, A100, A100)
    with pytest.raises(LookupError, match=r"^2 devices of one GPU model wanted: gpu:0 \(NVIDIA "
                                          r"L4\) has 0 of its model beside it; NVIDIA "
                                          r"A100-SXM4-80GB devices can take the job$"):
        choose_devices(s, TWO, "gpu:0", movable=True)
    assert train_task.admit(_job(s, "gpu:0", "pool.gpu.mxnet")) is None
    assert not any(leases.holders(s.broker, NODE, ["gpu:0", "gpu:1", "gpu:2"]).values())
    try:
        assert train_task.admit(_job(s, "gpu:1", "pool.gpu.mxnet")) == ["gpu:1", "gpu:2"]
        assert leases.holders(s.broker, NODE, ["gpu:1", "gpu:2"]) == {"gpu:1": 1, "gpu:2": 1}
    finally:
        leases.release(s.broker, NODE, ["gpu:1", "gpu:2"], 1)


def test_a_training_pinned_to_the_l4_fails_naming_the_models(isolated: Stack,
                                                             tmp_path: Path) -> None:
    """Sent to the L4's own queue (a multi-node part, or the API's device), no other worker may
    lead it: waiting would never end, so it is claimed and fails with why."""
    s = _node(isolated, tmp_path, L4, A100, A100)
    with pytest.raises(JobInputError) as failed:
        choose_devices(s, TWO, "gpu:0")
    assert str(failed.value) == (
        f"2 devices asked on gpu:0 (NVIDIA L4) but node {NODE} has 1 of that model that run MXNet "
        "(NVIDIA L4: gpu:0; NVIDIA A100-SXM4-80GB: gpu:1, gpu:2): a training never mixes GPU "
        "models (each step would wait for the slowest) unless --device lists them; --device "
        "auto:gpu runs it on NVIDIA A100-SXM4-80GB devices")
    assert train_task.admit(_job(s, "gpu:0", f"{NODE}.gpu.0")) == ["gpu:0"]  # claimed, to fail
    assert not any(leases.holders(s.broker, NODE, ["gpu:0", "gpu:1", "gpu:2"]).values())


def test_a_busy_a100_makes_the_training_wait_not_mix(isolated: Stack, tmp_path: Path) -> None:
    """The other A100 leased by another job: the training waits for it (LookupError: admit
    defers), though the L4 is free."""
    s = _node(isolated, tmp_path, A100, L4, A100)
    assert leases.acquire(s.broker, NODE, ["gpu:2"], 77, 60.0)
    try:
        with pytest.raises(LookupError, match="^2 devices wanted, 1 free now$"):
            choose_devices(s, TWO, "gpu:0", movable=True)
    finally:
        leases.release(s.broker, NODE, ["gpu:2"], 77)
    assert choose_devices(s, TWO, "gpu:0", movable=True) == ["gpu:0", "gpu:2"]


def test_a_listed_mix_of_models_is_the_users_choice(isolated: Stack, tmp_path: Path) -> None:
    s = _node(isolated, tmp_path, L4, A100, A100)
    listed = TrainParams(**{**TRAIN, "device_list": ["gpu:0", "gpu:1"]})
    assert choose_devices(s, listed, "gpu:0") == ["gpu:0", "gpu:1"]


def test_the_closest_of_the_model_first_then_the_least_loaded(isolated: Stack,
                                                              tmp_path: Path) -> None:
    """Four A100s, gpu:0-1 and gpu:2-3 each on a PCIe switch, SYS between the pairs; the L4s
    never count. A busy GPU on the leader's switch still beats an idle one across the sockets;
    between equally close ones the idle one wins (it went to the lowest index, busy or not)."""
    s = _node(isolated, tmp_path, A100, A100, A100, A100, L4, L4, busy=(1, 2),
              topo="pcie-4gpu.txt")
    assert choose_devices(s, TWO, "gpu:0") == ["gpu:0", "gpu:1"]
    assert leases.acquire(s.broker, NODE, ["gpu:1"], 77, 60.0)
    try:
        assert choose_devices(s, TWO, "gpu:0") == ["gpu:0", "gpu:3"]
    finally:
        leases.release(s.broker, NODE, ["gpu:1"], 77)


def test_closest_breaks_ties_by_load() -> None:
    assert closest({}, [0, 1, 2], 2, must=0) == [0, 1]
    assert closest({}, [0, 1, 2], 2, must=0, load={1: 1}) == [0, 2]
    links = {(0, 1): "PIX", (1, 0): "PIX"}
    assert closest(links, [0, 1, 2], 2, must=0, load={1: 1}) == [0, 1]  # closer beats idler


def test_a_multi_node_training_counts_each_nodes_gpus_of_the_leaders_model(
        isolated: Stack, tmp_path: Path) -> None:
    """Two A100s here, two L4s on n2: no second node has two A100s (it counted n2's L4s, and
    each step would have waited for them); once n3 has two A100s, n3 is the partner."""
    s = _node(isolated, tmp_path, A100, A100)
    for index in (0, 1):
        register(s.database, f"gpu{index}@n2", "n2", f"gpu:{index}", f"n2.gpu.{index}", None, L4,
                 engines=("mxnet", "onnx"))
    two_nodes = TrainParams(**{**TRAIN, "devices": 2, "nodes": 2})
    with pytest.raises(JobInputError, match=r"2 nodes with 2 NVIDIA A100-SXM4-80GB devices each "
                                            r"asked but only 1 have that many"):
        choose_nodes(s, two_nodes, "gpu:0")
    for index in (0, 1):
        register(s.database, f"gpu{index}@n3", "n3", f"gpu:{index}", f"n3.gpu.{index}", None, A100,
                 engines=("mxnet", "onnx"))
    assert choose_nodes(s, two_nodes, "gpu:0") == [(NODE, "gpu:0"), ("n3", "gpu:0")]
