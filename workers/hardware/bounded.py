"""Running a driver tool (nvidia-smi) within a time bound, whatever it does.

`subprocess.run(timeout=...)` drops what the process printed before it hung, and after killing it
waits for its output to close, which a process stuck in the driver (or a child of it holding the
pipe) never does: a node that asked a hung nvidia-smi about its GPUs stopped for good.
"""

from __future__ import annotations

import subprocess
import threading
from typing import IO

# The status of a run that did not end in time (no process exits with it).
TIMED_OUT = 255 << 8
# How long the output is still read once the process was killed: a pipe some other process holds
# open is left behind after this.
DRAIN_SECONDS = 1.0


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`command`'s exit status, output and errors; after `timeout` seconds it is killed and the
    result has status TIMED_OUT, the output it printed until then, and errors that say so."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [threading.Thread(target=_drain, args=(stream, into), daemon=True)
               for stream, into in ((proc.stdout, out), (proc.stderr, err))]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = TIMED_OUT
    for reader in readers:
        reader.join(timeout=DRAIN_SECONDS if code == TIMED_OUT else None)
    said = b"".join(err).decode(errors="replace")
    if code == TIMED_OUT:
        said = f"no answer in {timeout} s" + (f" ({said.strip()})" if said.strip() else "")
    return subprocess.CompletedProcess(command, code, b"".join(out).decode(errors="replace"), said)


def _drain(stream: IO[bytes] | None, into: list[bytes]) -> None:
    """Read `stream` line by line into `into`, so a hang keeps what came before it."""
    if stream is not None:
        for line in iter(stream.readline, b""):
            into.append(line)
