"""Who holds a TCP port: `mxq up` refuses to start an API that could not listen, and says which
process is in its way (from /proc/net/tcp{,6} and the sockets in /proc/*/fd, where readable)."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from mxq.workers.launch import procs

LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket


def in_use(host: str, port: int) -> bool:
    """Something already listens on host:port (a bind there fails with EADDRINUSE)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` (any address), as /proc/net lists them."""
    found = set()
    for table in (procs.PROC / "net" / "tcp", procs.PROC / "net" / "tcp6"):
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found


def holder(port: int) -> procs.Proc | None:
    """The process listening on `port`, when this user may see it; else None."""
    inodes = {f"socket:[{i}]" for i in listening_inodes(port)}
    if not inodes:
        return None
    for fd_dir in procs.PROC.glob("[0-9]*/fd"):
        if inodes & _links(fd_dir):
            return procs.identify(int(fd_dir.parent.name))
    return None


def _links(fd_dir: Path) -> set[str]:
    """What the open files of one process point at; empty for another user's process."""
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return set()
    found = set()
    for fd in fds:
        try:
            found.add(str(fd.readlink()))
        except OSError:
            continue  # closed meanwhile
    return found


def clash(host: str, port: int) -> str | None:
    """One line saying who holds host:port, or None when it is free."""
    if not in_use(host, port):
        return None
    who = holder(port)
    by = f"by {who.describe()}" if who else "(by a process this user cannot see)"
    return (f"the API port {host}:{port} is in use {by}; stop that process or choose another "
            f"port with MXQ_API_PORT=PORT")
