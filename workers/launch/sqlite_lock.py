"""Which process holds an SQLite database's write lock, read from the kernel's lock table.

SQLite in WAL mode lets one writer at a time in, by a POSIX lock on one byte of the `-shm` file
(byte 120, WAL_WRITE_LOCK, in os_unix.c), held from a write transaction's first write to its
commit. A process stopped inside such a transaction (SIGSTOP, Ctrl-Z) keeps it: every other
writer of the stack, heartbeats, claims and the reconciler included, waits behind it for as long
as it is stopped, and no server exists to end its session (PostgreSQL's
idle_in_transaction_session_timeout does that there). Only its death frees the lock, so the
launcher ends a child stopped while holding it (`mxq.workers.launch.launcher`). Linux lists every
POSIX lock in /proc/locks with its owner's PID, device and inode.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCKS = Path("/proc/locks")
# The byte of the -shm file that SQLite's WAL writer locks: UNIX_SHM_BASE ((22 + 8) * 4) plus
# WAL_WRITE_LOCK (0). Stable since WAL came in (SQLite 3.7.0): it is part of the file format
# that processes of different SQLite versions share.
WAL_WRITE_BYTE = 120


def shm_file(url: str) -> Path | None:
    """The `-shm` file of an SQLite URL's database (`sqlite:///PATH`, `sqlite+DRIVER:///PATH`,
    query options aside); None for any other database, or one in memory."""
    scheme, sep, rest = url.partition(":///")
    path = rest.split("?", 1)[0]
    if not sep or not scheme.startswith("sqlite") or path in ("", ":memory:"):
        return None
    return Path(f"{path}-shm")


def _holds_write_byte(fields: list[str], device: str, inode: int) -> int | None:
    """The PID of a /proc/locks entry that is a POSIX write lock over WAL_WRITE_BYTE of the
    file (device as `major:minor` in hex, as the kernel prints it); None for any other entry."""
    if len(fields) < 8 or fields[1] not in ("POSIX", "OFDLCK"):  # "->": a waiter, not a holder
        return None
    kind, pid, file_id, start, end = fields[3], fields[4], fields[5], fields[6], fields[7]
    dev_major, dev_minor, ino = (file_id.split(":") + ["", "", ""])[:3]
    if kind != "WRITE" or not ino.isdigit() or int(ino) != inode:
        return None
    if f"{int(dev_major, 16):x}:{int(dev_minor, 16):x}" != device:
        return None
    last = float("inf") if end == "EOF" else int(end)
    return int(pid) if int(start) <= WAL_WRITE_BYTE <= last and pid.lstrip("-").isdigit() else None


def writer(url: str) -> int | None:
    """The PID holding the database's write lock now, or None (no writer, no such file, not
    SQLite, no /proc/locks). An open file description lock (OFDLCK) has no owner PID (-1)."""
    shm = shm_file(url)
    if shm is None:
        return None
    try:
        st = shm.stat()
        lines = LOCKS.read_text().splitlines()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):x}:{os.minor(st.st_dev):x}"
    for line in lines:
        pid = _holds_write_byte(line.split(), device, st.st_ino)
        if pid is not None and pid > 0:
            return pid
    return None
