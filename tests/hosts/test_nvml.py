"""NVML read in the heartbeat (issue 60, item 7), in this process: the rules of
`mxq.workers.fleet.gpu_health`, and `mxq.workers.fleet.nvml` against the fake `pynvml` of
tests/fixtures/nvml (the real-worker path is tests/faults/test_nvml.py). NVML that is absent or
broken never breaks a worker: it reads nothing and says why once."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxq.workers.fleet import gpu_health, nvml
from tests.conftest import FIXTURES

GPU = {"memory_used_mib": 512, "memory_total_mib": 16384, "ecc_uncorrected": 0,
       "row_remap_pending": False, "row_remap_failed": False, "clocks": 0, "xids": []}


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake pynvml importable, as the GPU of `gpu:0`, `GPU` written to its file; NVML's
    per-process state (initialised once, each GPU opened once) fresh."""
    monkeypatch.syspath_prepend(str(FIXTURES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("MXQ_TEST_NVML", str(tmp_path))
    monkeypatch.setenv("MXQ_DEVICE", "gpu:0")
    monkeypatch.setattr(nvml, "_library", None)
    monkeypatch.setattr(nvml, "_tried", False)
    nvml.open_gpu.cache_clear()
    _write(tmp_path, **GPU)
    yield tmp_path
    nvml.open_gpu.cache_clear()


def _write(folder: Path, **state: object) -> None:
    path = folder / "gpu0.json"
    was = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**was, **state}))


def _gpu() -> nvml.Nvml:
    gpu = nvml.open_gpu("gpu", "0", "gpu:0")
    assert gpu is not None
    return gpu


def test_a_worker_reads_the_gpu_its_own_cuda_visible_devices_names() -> None:
    assert nvml.target("gpu", "3") == 3
    assert nvml.target("gpu", "GPU-8f6a3c1e-0000") == "GPU-8f6a3c1e-0000"
    assert nvml.target("cpu", "") is None and nvml.target("gpu", None) is None
    assert nvml.target("gpu", "0,1") is None  # not a worker pinned to one GPU


def test_xids_of_the_application_leave_the_gpu_in_service_others_take_it_out() -> None:
    for xid in (13, 31, 43, 45, 68, 109):
        assert gpu_health.xid_fault(xid) is None
    assert gpu_health.xid_fault(79) == "NVML reported critical Xid 79 (GPU has fallen off the bus)"
    assert gpu_health.xid_fault(48) == "NVML reported critical Xid 48 (double-bit ECC error)"
    assert gpu_health.verdict({}, [13, 79, 48]) == gpu_health.xid_fault(79)  # the first that counts
    assert gpu_health.verdict({"ecc_uncorrected": 0, "row_remap_pending": False}, [13]) is None


def test_sticky_conditions_say_which() -> None:
    assert "row remap pending" in str(gpu_health.sticky({"row_remap_pending": True}))
    assert "row remap failure" in str(gpu_health.sticky({"row_remap_failed": True}))
    assert "retired pages pending" in str(gpu_health.sticky({"retired_pages_pending": True}))
    assert gpu_health.sticky({"ecc_uncorrected": 2}) == (
        "NVML reports 2 uncorrectable ECC errors since the driver loaded (volatile)")
    assert gpu_health.sticky({"ecc_uncorrected": None, "retired_pages_pending": False}) is None


def test_clock_event_reasons_are_named_and_an_unknown_bit_kept() -> None:
    assert gpu_health.clock_reasons(0x8 | 0x40) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert gpu_health.clock_reasons(0x1000) == ["bit_0x1000"]
    assert gpu_health.note({"health": "ok", "reason": None, "clock_event_reasons": ["gpu_idle"]}) == "ok"
    assert gpu_health.note(None) == ""


def test_a_reading_has_live_memory_and_each_signal(fake: Path) -> None:
    gpu = _gpu()
    assert gpu.read() == {"memory_used_mib": 512, "memory_total_mib": 16384, "ecc_uncorrected": 0,
                          "row_remap_pending": False, "row_remap_failed": False,
                          "clock_event_reasons": [], "xids": [], "health": "ok", "reason": None}
    _write(fake, memory_used_mib=9000, clocks=0x4, xids=[31])
    read = gpu.read()
    assert (read["memory_used_mib"], read["clock_event_reasons"], read["xids"]) == (
        9000, ["sw_power_cap"], [31])
    assert read["health"] == "ok"
    assert gpu.read()["xids"] == [31]  # an event is delivered once; the reading keeps the latest
    _write(fake, ecc_uncorrected=1)
    assert gpu.read()["reason"] == gpu_health.sticky({"ecc_uncorrected": 1})
    assert gpu.sticky() is not None
    _write(fake, ecc_uncorrected=0)
    assert gpu.sticky() is None  # cleared (a reset): the start check lets it back
    assert gpu.read()["health"] == "fault"  # while this worker lives, its verdict stands


def test_a_gpu_without_a_counter_reads_null_and_an_older_one_its_retired_pages(fake: Path) -> None:
    _write(fake, ecc_uncorrected=None, row_remap_pending=None, retired_pages_pending=True)
    read = _gpu().read()
    assert read["ecc_uncorrected"] is None and "row_remap_pending" not in read
    assert read["retired_pages_pending"] is True and "retired pages pending" in str(read["reason"])


def test_a_gpu_that_is_lost_is_a_fault(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = _gpu()
    lib = importlib.import_module("pynvml")

    def lost(handle: object) -> None:
        raise lib.NVMLError(lib.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(lib, "nvmlDeviceGetMemoryInfo", lost)
    read = gpu.read()
    assert read["memory_used_mib"] is None and read["health"] == "fault"
    assert read["reason"] == "NVML reports the GPU is lost (reading its memory)"


def test_nvml_that_fails_to_start_is_said_once_and_read_nowhere(
        fake: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write(fake, init_error=True)
    with caplog.at_level(logging.INFO, logger=nvml.__name__):
        assert nvml.open_gpu("gpu", "0", "gpu:0") is None
        assert nvml.open_gpu("gpu", "1", "gpu:1") is None
    said = [r.getMessage() for r in caplog.records]
    assert said == ["NVML not read: nvmlInit failed (NVMLError: Driver Not Loaded)"], said


def test_without_pynvml_a_cpu_host_reads_nothing_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(nvml, "_library", None)
    monkeypatch.setattr(nvml, "_tried", False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as without nvidia-ml-py
    nvml.open_gpu.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=nvml.__name__):
            assert nvml.open_gpu("gpu", "0", "gpu:0") is None
            assert nvml.open_gpu("gpu", "1", "gpu:1") is None
            assert nvml.open_gpu("cpu", "", "cpu:0") is None
    finally:
        nvml.open_gpu.cache_clear()
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith("NVML not read: ")
    assert "nvidia-ml-py" in caplog.records[0].getMessage()


def test_a_gpu_nvml_does_not_know_is_said_by_name(fake: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=nvml.__name__):
        assert nvml.open_gpu("gpu", "GPU-nope", "gpu:2") is None
    assert [r.getMessage() for r in caplog.records] == [
        "NVML not read for gpu:2: no NVML device 'GPU-nope' (Not Found)"]
