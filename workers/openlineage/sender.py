"""The OpenLineage export's pass, run by the schedule process when OpenLineage is configured:
read the jobs with events due (`mxq.db.lineage.openlineage.due`), send each job's through the
`openlineage-python` client (its own configuration chooses the transport: http, file, console,
kafka, …), and record what went. A failed send is retried with a growing wait and stops the
pass (the receiver is likely down: the next pass tries again); nothing here slows a job.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from mxq.db.lineage import openlineage as outbox
from mxq.db.stack import stack_id
from mxq.errors import typed_line
from mxq.workers.settings import Settings

if TYPE_CHECKING:
    from openlineage.client import OpenLineageClient

log = logging.getLogger(__name__)


def configured() -> bool:
    """Whether OpenLineage is configured as its client reads it: OPENLINEAGE_URL, a config file
    (OPENLINEAGE_CONFIG, `openlineage.yml` in the working folder or `~/.openlineage/`), or
    OPENLINEAGE__TRANSPORT__* variables; and not OPENLINEAGE_DISABLED=true. Off otherwise (the
    client alone would print every event to the console)."""
    if os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    files = (os.environ.get("OPENLINEAGE_CONFIG"), "openlineage.yml",
             str(Path.home() / ".openlineage" / "openlineage.yml"))
    return bool(os.environ.get("OPENLINEAGE_URL")) or any(f and Path(f).is_file() for f in files) \
        or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in os.environ)


@functools.cache
def client() -> OpenLineageClient:
    """One client per process: its transport keeps its connections. (The client and the event
    classes load on the first pass: a process where OpenLineage is off never imports them.)"""
    from openlineage.client import OpenLineageClient

    return OpenLineageClient()


def send_due(settings: Settings) -> int:
    """One pass: the events sent (0 when OpenLineage is not configured)."""
    if not configured():
        return 0
    from mxq.workers.openlineage.events import Source, events

    url, sent = settings.database, 0
    source = Source(stack_id(url), url, importlib.metadata.version("mxq"),
                    os.environ.get("OPENLINEAGE_NAMESPACE", "").strip() or "mxq")
    for facts in outbox.due(url):
        try:
            for event in events(facts, source):
                client().emit(event)
                sent += 1
        except Exception as exc:  # the transport's own error, whatever it is: retried later
            log.warning("OpenLineage: job %s's events not sent: %s", facts.id, typed_line(exc))
            outbox.failed(url, facts.id, typed_line(exc))
            break
        outbox.sent(url, facts.id, facts.start_due, facts.end_due)
    return sent
