"""How much the prefetch thread reads at once (`infer.read_size`): whole batches, at least one,
bounded by bytes, by the rows a flush holds and by the compute time of the last batch, so that
a fast small model hands over many batches at a time and a slow model's cancel or preemption
never waits behind a long read; a read that runs out of host memory is tried again. And the
.npy's flush (`outputs.NpyOutput`) places every value at its sample's offset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxq.tasks.inference import infer
from mxq.tasks.inference.infer import FLUSH_ROWS, READ_BYTES, READ_SECONDS, read_size
from mxq.tasks.inference.inputs import InputSource
from mxq.tasks.inference.outputs import NpyOutput
from mxq.tasks.runtimes.oom import OutOfMemory
from mxq.workers.jobs.jobspecs import InferParams

PARAMS = InferParams(model="m", input="x.npy")


def test_a_read_is_whole_batches_bounded_by_bytes_rows_and_time() -> None:
    # An MLP's batch of 512 x 256 floats (512 KiB) every 0.4 ms: bytes bound it.
    assert read_size(512, (256,), 0.0004) == 512 * (READ_BYTES // (512 * 256 * 4))
    # One 4-float sample a batch, timed as instant: the rows a flush holds bound it.
    assert read_size(1, (4,), 1e-9) == FLUSH_ROWS
    # A slow model (0.02 s a batch of 4 small samples): READ_SECONDS of it.
    assert read_size(4, (8,), 0.02) == 4 * int(READ_SECONDS / 0.02)
    # Not timed yet, or a batch larger than every bound: one batch.
    assert read_size(512, (256,), None) == 512
    assert read_size(64, (3, 224, 224), 0.0001) == 64
    assert read_size(100_000, (4,), 0.0001) == 100_000


def test_the_npy_flush_places_every_value_at_its_samples_offset(tmp_path: Path) -> None:
    """The .npy's flush (`NpyOutput.write`: pwrite at the results' offsets, then fdatasync; the
    writer thread's syscalls release the GIL, where `mmap.flush` held it through its msync)
    writes each part where its samples belong, whatever the order of the parts. (A counting
    thread kept more than half its pace through a 64 MiB write, a fifth with `mmap.flush`: a
    timing, which a test on a loaded machine cannot assert; issue 46.)"""
    path = tmp_path / "out.npy"
    classes, samples = 16, 1 << 16
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(samples, classes)).flush()
    with path.open("rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        out = NpyOutput(path, classes, f.tell())
    values = np.arange(samples * classes, dtype=np.float32).reshape(samples, classes)
    half = samples // 2  # written second half first: offsets, not order, place them
    out.write([(half, values[half:]), (0, values[:half])])
    assert np.array_equal(np.load(path), values)


def _flaky_source(failures: int) -> tuple[InputSource, list[tuple[int, int]]]:
    """Eight samples whose first `failures` fetches run out of host memory."""
    data, calls = np.arange(32, dtype=np.float32).reshape(8, 4), []

    def fetch(start: int, stop: int) -> np.ndarray:
        calls.append((start, stop))
        if len(calls) <= failures:
            raise MemoryError("Unable to allocate 8.00 MiB")
        return data[start:stop]

    return InputSource(Path("x.npy"), 8, (4,), fetch), calls


def test_a_read_that_runs_out_of_memory_is_tried_again_at_the_size_then_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefetch thread can run out of host memory while a batch that does not fit holds
    it: the read is tried again, at the (smaller) size the compute thread settled on by then."""
    monkeypatch.setattr(infer, "READ_RETRY_SECONDS", 0.001)
    source, calls = _flaky_source(failures=2)
    sizes = iter([8, 8, 4, 4, 4])
    reads = list(infer._batches(PARAMS, source, 0, 8, lambda _: next(sizes)))
    assert [first for first, _ in reads] == [0, 4]
    assert np.array_equal(np.concatenate([x for _, x in reads]), np.arange(32).reshape(8, 4))
    assert calls == [(0, 8), (0, 8), (0, 4), (4, 8)]


def test_a_read_out_of_memory_for_long_fails_the_job_as_out_of_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(infer, "READ_RETRY_SECONDS", 0.001)
    monkeypatch.setattr(infer, "READ_OOM_SECONDS", 0.005)
    source, calls = _flaky_source(failures=1000)
    with pytest.raises(OutOfMemory, match=r"^out of host memory reading samples from 0 of input "
                                          r"x\.npy \(tried for 0\.005 s\)$"):
        next(infer._batches(PARAMS, source, 0, 8, lambda _: 8))
    assert 2 <= len(calls) < 1000
