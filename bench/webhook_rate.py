"""Webhook delivery rate: the schedule process's sender (`mxq.workers.webhooks.sender.send_due`)
against the same POSTs made by a bare loop, both to a receiver on loopback that answers 200 at
once (issue 58: at least 50 deliveries a second to such endpoints).

mxq's figure is every outbox row it delivers: claimed from SQL (a guarded UPDATE), its endpoint
checked against the allowlist and resolved, signed, POSTed, its answer recorded. The bare loop
POSTs the same signed bodies from as many threads with a new connection each, as the sender
does, and records nothing. Two endpoints share the events, as two teams' would.

    python -m bench.webhook_rate [--deliveries 2000]
"""

from __future__ import annotations

import argparse
import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.stack import scratch
from mxq.db import jobs
from mxq.db.migrate import upgrade
from mxq.db.schema import utcnow
from mxq.db.webhooks import outbox
from mxq.workers.settings import Settings
from mxq.workers.webhooks import sender, signing

ENDPOINTS = 2


class _Quick(BaseHTTPRequestHandler):
    """Reads the body and answers 200 at once."""

    def do_POST(self) -> None:  # http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def receiver() -> Iterator[int]:
    """A threaded HTTP server on 127.0.0.1 that answers every POST 200 at once: its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Quick)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _bare(port: int, bodies: list[bytes]) -> float:
    """The same POSTs from MAX_SENDING threads, a connection each: deliveries a second."""
    todo, lock = list(bodies), threading.Lock()

    def one_thread() -> None:
        while True:
            with lock:
                if not todo:
                    return
                raw = todo.pop()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/hook", body=raw, headers={"Content-Type": "application/json"})
            assert conn.getresponse().status == 200
            conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=one_thread) for _ in range(sender.MAX_SENDING)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(bodies) / (time.perf_counter() - started)


def _events(s: Settings, events: int) -> None:
    """`events` failed jobs: a `job.failed` delivery each for every endpoint."""
    for i in range(events):
        jobs.fail(s.database, jobs.create_job(s.database, "probe", {}, "cpu:0", "bench.cpu.0"),
                  f"bench failure {i}")


def run(deliveries: int = 2000, root: Path | None = None) -> dict[str, Any]:
    with scratch(root, prefix="webhooks-") as home, receiver() as port:
        s = Settings(home=home, hook_allowed_hosts="127.0.0.1", database_url=None)
        upgrade(s.database)
        for _ in range(ENDPOINTS):
            sender.add_hook(s, f"http://127.0.0.1:{port}/hook", ["job.failed"], "admin")
        _events(s, deliveries // ENDPOINTS)
        due = outbox.list_deliveries(s.database, None, "pending", deliveries)
        bodies = [signing.body(d["id"], d["event"], d["created_at"], d["payload"]) for d in due]
        bare = _bare(port, bodies)
        started = time.perf_counter()
        sent = sender.send_due(s, utcnow(), wait=True)
        mxq = sent / (time.perf_counter() - started)
        statuses = {d["status"] for d in outbox.list_deliveries(s.database, None, None, deliveries)}
        assert sent == len(due) and statuses == {"delivered"}, (sent, len(due), statuses)
    print(f"  {sent:,} deliveries to {ENDPOINTS} endpoints: bare loop {bare:,.0f}/s, "
          f"mxq sender {mxq:,.0f}/s ({mxq / bare:.2f})", flush=True)
    return {"deliveries": sent, "endpoints": ENDPOINTS, "senders": sender.MAX_SENDING,
            "bare": bare, "mxq": mxq, "ratio": mxq / bare}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deliveries", type=int, default=2000)
    run(ap.parse_args().deliveries)
