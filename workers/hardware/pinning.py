"""What pins a worker process to its device, shared by the launcher (which starts workers) and
the job code inside them (which starts training children): core slices, thread limits, and the
exit code a worker uses to say its device is unusable. No process is started here."""

from __future__ import annotations

import os

REFUSED_EXIT = 78  # a worker exits so when its device is unusable: do not restart it
REFUSAL_PREFIX = "mxq: refusing to start: "  # what such a worker prints before it exits
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cpu_cores(index: int, count: int) -> list[int]:
    """The slice of this process's cores that CPU device `index` of `count` gets."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // count)
    start = (index * share) % len(cores)
    return cores[start:start + share]
