"""A GPU that fails is the device's fault, said as such (issue 45, item 1), with real MXNet: a
GPU cannot exist here, so MXNet's own errors for a GPU context stand in for a faulty one (the
CPU build answers every GPU operation with an MXNetError, as a GPU fallen off the bus does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxq.device import Device
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.mxnet.files import open_net
from mxq.tasks.runtimes import mx_context
from mxq.tasks.runtimes.mx import DeviceFault, gluon, mx

GPU = Device.parse("gpu:0")


def test_a_gpu_that_counts_but_fails_an_operation_is_refused_at_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The start check only counted GPUs: one MXNet counts that fails every operation passed,
    and the worker took job after job and failed each."""
    monkeypatch.setattr(mx.context, "num_gpus", lambda: 1)
    refused = mx_context.check_visible(GPU)
    assert refused is not None and refused.startswith("worker for gpu:0: the GPU failed its start check (")
    assert "MXNetError" in refused and "\n" not in refused


def test_a_cuda_error_while_counting_refuses_the_device_instead_of_raising(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> int:
        raise RuntimeError("CUDA: unspecified launch failure")

    monkeypatch.setattr(mx.context, "num_gpus", broken)
    assert mx_context.check_visible(GPU) == ("worker for gpu:0: the GPU failed its start check "
                                             "(CUDA: unspecified launch failure)")


def _exported(folder: Path) -> tuple[Path, Path]:
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(3))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 4)))
    net.export(str(folder / "m"), 0)
    return folder / "m-symbol.json", folder / "m-0000.params"


def test_a_device_that_fails_while_loading_is_not_the_users_mismatch(tmp_path: Path) -> None:
    """Any exception while loading was "params file … does not match symbol …": four jobs on a
    faulty GPU failed blaming the user's files."""
    symbol, params = _exported(tmp_path)
    with pytest.raises(DeviceFault, match=r"^the device \(gpu\(0\)\) failed while loading the model: "
                                          r"MXNetError: GPU is not enabled"):
        open_net(symbol, params, mx.gpu(0))
    other = tmp_path / "other"
    other.mkdir()
    _, wrong = _exported(other)
    symbol.write_text(symbol.read_text().replace('"num_hidden": "3"', '"num_hidden": "5"'))
    with pytest.raises(ModelError, match="does not match symbol"):  # a real mismatch stays one
        open_net(symbol, wrong, mx.cpu())
