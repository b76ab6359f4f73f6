"""A webhook receiver for the tests: a real HTTP server on 127.0.0.1 in a thread, which checks
each delivery's signature with the verification snippet of docs/webhooks.md (executed as a user
would paste it; never the product's own `signing.verify`, which could agree with a wrong
signer) and with the Standard Webhooks library (`standardwebhooks`, as a team using that
specification would), and answers by path: `/ok` 200, `/flaky` 500 then 200, `/down` 500, `/redirect` a 302
to another host, `/hang` nothing for 30 s, `/dribble` a 200 one byte every half second."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from mxq.workers.webhooks import signing
from tests.conftest import ROOT

Verify = Callable[..., bool]  # docs/webhooks.md's verify(secret, headers, body, tolerance=300)


def docs_verify() -> Verify:
    """The `verify` function of docs/webhooks.md's "Verifying a delivery" section, executed."""
    page = (ROOT / "docs" / "webhooks.md").read_text()
    section = page.split("## Verifying a delivery", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/webhooks.md has no python snippet under 'Verifying a delivery'"
    scope: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/webhooks.md", "exec"), scope)
    return cast(Verify, scope["verify"])


STANDARD_HEADERS = (signing.STANDARD_ID, signing.STANDARD_TIMESTAMP, signing.STANDARD_SIGNATURE)


@dataclass
class Received:
    path: str
    delivery: str
    event: str
    body: bytes
    timestamp: str
    signature: str
    standard: dict[str, str]  # the Standard Webhooks headers: webhook-id, -timestamp, -signature


@dataclass
class Receiver:
    port: int
    secrets: dict[str, str] = field(default_factory=dict)  # path -> the endpoint's secret
    standard_secrets: dict[str, str] = field(default_factory=dict)  # path -> its whsec_ form
    got: list[Received] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def on(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.got if r.path == path]

    def add(self, path: str, created: Mapping[str, Any]) -> None:
        """Keep an endpoint's secrets, both forms, as its add answered them."""
        self.secrets[path], self.standard_secrets[path] = created["secret"], created["standard_secret"]

    def verified(self, r: Received) -> bool:
        """Both ways a receiver verifies a delivery: the docs' snippet with mxq's headers, and
        the Standard Webhooks library with its own (and the whsec_ secret)."""
        headers = {signing.DELIVERY: r.delivery, signing.TIMESTAMP: r.timestamp,
                   signing.SIGNATURE: r.signature}
        return docs_verify()(self.secrets[r.path], headers, r.body) and standard_verified(
            self.standard_secrets[r.path], r.standard, r.body)


def standard_verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What `standardwebhooks` (the specification's Python library) says of a delivery."""
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


@contextmanager
def receiving() -> Iterator[Receiver]:
    box: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            receiver: Receiver = box["r"]
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.got.append(Received(self.path, self.headers[signing.DELIVERY],
                                             self.headers[signing.EVENT], raw,
                                             self.headers[signing.TIMESTAMP],
                                             self.headers[signing.SIGNATURE],
                                             {k: self.headers[k] for k in STANDARD_HEADERS}))
                seen = len([r for r in receiver.got if r.path == self.path])
            if self.path == "/hang":
                receiver.stop.wait(30)
            if self.path == "/dribble":  # a 200, one byte every half second: each read succeeds
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                    if receiver.stop.wait(0.5):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                return
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "http://example.org/elsewhere")
            else:
                self.send_response(500 if self.path == "/down" or (self.path == "/flaky" and seen == 1)
                                   else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    box["r"] = receiver = Receiver(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.stop.set()
        server.shutdown()
        server.server_close()
