"""A TCP relay on loopback in front of a real server, which a test can freeze: it keeps every
connection open and accepts new ones, but passes nothing on, as the kernel of a server whose
processes are all stopped does (it acknowledges what is sent; no answer ever comes)."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


class Relay:
    """Connections to `127.0.0.1:port` are relayed to `upstream` until `frozen()`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.moving = threading.Event()
        self.moving.set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:  # closed
                return
            far = socket.create_connection(self.upstream)
            self._open += [near, far]
            for source, sink in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.moving.wait()  # frozen: held here, as a stopped server's socket buffer holds it
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            end.close()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Nothing passes inside the block; what was sent meanwhile passes after it."""
        self.moving.clear()
        try:
            yield
        finally:
            self.moving.set()

    def close(self) -> None:
        self._listener.close()
        for end in self._open:
            end.close()
