"""`mxq logs JOB [--follow]`: what a job printed (its training child's stdout and stderr, its
worker's log lines while it ran, mxq's notes), read from SQL (`mxq.db.outputs.logs`); `--follow`
prints each new line as it comes until the job ended (`mxq.client.follow`, as the client's
`Job.logs(follow=True)`)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from mxq.cli import render
from mxq.cli.errors import EXIT_JOB_FAILED
from mxq.cli.settings import get_settings
from mxq.client.follow import lines
from mxq.names import MAX_ID
from mxq.status import UNSUCCESSFUL


def logs(job_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="A job's id.")],
         follow: Annotated[bool, typer.Option("--follow", "-f", help="Print each new line as it "
                                              "comes, until the job ended.")] = False,
         json_: Annotated[bool, typer.Option("--json", help="One JSON object a line (seq, at, "
                                             "source, text), for scripts.")] = False) -> None:
    """What a job printed: a training's epoch lines and its child's output, its worker's log
    lines, kept in SQL up to MXQ_JOB_LOG_BYTES (its first and latest lines); exits 1 when the
    job failed or was cancelled."""
    from mxq.db.outputs import logs as stored
    from mxq.db.reports.history import require_job

    s = get_settings()
    require_job(s.database, job_id)  # NotFound: exit 2, one line
    for line in lines(lambda after: stored.read(s.database, job_id, after, stored.MOST_READ), follow):
        text = json.dumps(dict(line)) if json_ else str(line["text"])
        print(text, flush=follow)
    sys.stdout.flush()
    record = require_job(s.database, job_id)
    if record["status"] in UNSUCCESSFUL:
        render.err.print(f"mxq: job {job_id} {record['status']}: {record['error']}", markup=False)
        raise typer.Exit(EXIT_JOB_FAILED)
