"""How much the prefetch thread reads at once (`infer.read_size`): whole batches, at least one,
bounded by bytes, by the rows a flush holds and by the compute time of the last batch, so that
a fast small model hands over many batches at a time and a slow model's cancel or preemption
never waits behind a long read. And the .npy's sync (`outputs.sync`) lets other threads run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from mxq.tasks.inference.infer import FLUSH_ROWS, READ_BYTES, READ_SECONDS, read_size
from mxq.tasks.inference.outputs import sync


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


def test_syncing_the_npy_lets_other_threads_run(tmp_path: Path) -> None:
    """mmap.flush holds the GIL through its msync (a thread counting meanwhile ran at a fifth of
    its pace, here); `sync` (fdatasync) must not: the counting thread keeps at least half its
    pace while 64 MiB of dirty mapped pages are written back."""
    path = tmp_path / "out.npy"
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(1 << 24,))
    array[:] = 1.0
    counted, stop = [0], threading.Event()

    def count() -> None:
        while not stop.is_set():
            counted[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    time.sleep(0.02)  # under way
    before, started = counted[0], time.perf_counter()
    time.sleep(0.05)  # the main thread idle: the counter's own pace
    pace = (counted[0] - before) / (time.perf_counter() - started)
    before, started = counted[0], time.perf_counter()
    sync(array)
    during = (counted[0] - before) / (time.perf_counter() - started)
    stop.set()
    counter.join()
    assert during >= pace / 2, f"the counter ran {during:.0f}/s during the sync, {pace:.0f}/s alone"
    assert np.array_equal(np.load(path, mmap_mode="r")[:10], np.ones(10, np.float32))
