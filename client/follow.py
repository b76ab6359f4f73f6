"""A job's log read to its end: the one loop `mxq logs --follow` and `Job.logs(follow=True)` run,
over whatever reads a page of it (SQL for the CLI, the HTTP API for the client).

A page (`GET /jobs/{id}/logs?after=N`) holds the lines after N, `next` to ask after, the job's
`status`, and `ended` once the job finished and its last attempt wrote its last line. A job
whose worker died after its outcome was recorded never writes that line: the loop then stops
`GRACE_SECONDS` after it first saw the job finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from mxq.status import FINISHED

POLL_SECONDS = 1.0  # a running job's log reaches SQL about every second
GRACE_SECONDS = 10.0

Page = Mapping[str, object]  # {"items": [{"seq", "at", "source", "text"}], "next", "status", "ended"}
Line = Mapping[str, object]  # {"seq", "at", "source", "text"}


def lines(read: Callable[[int], Page], follow: bool, poll: float = POLL_SECONDS,
          grace: float = GRACE_SECONDS) -> Iterator[Line]:
    """The log's lines from its first: what is there now, or with `follow` every new one as it
    comes until the log ended."""
    after, finished_at = 0, None
    while True:
        items, after, status, ended = _parts(read(after))
        yield from items
        if ended or not follow:
            return
        if items:
            continue  # a full page: read on at once
        if status in FINISHED:
            finished_at = finished_at or time.monotonic()
            if time.monotonic() - finished_at > grace:
                return
        time.sleep(poll)


def _parts(page: Page) -> tuple[list[Line], int, object, bool]:
    """A page's lines, the number to read after, the job's status, and whether the log ended."""
    items, after = page["items"], page["next"]
    if not isinstance(items, list) or not isinstance(after, int):
        raise TypeError(f"not a page of a job's log: {sorted(page)}")
    return items, after, page["status"], bool(page["ended"])
