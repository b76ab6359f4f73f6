"""`mxq gc`, `mxq pin`, `mxq unpin`: the retention policy applied now (or what it would remove),
and the outputs a user keeps whatever it says (`mxq.workers.retention`, docs/retention.md).

Run on the stack's machine, as its local admin (like `mxq users`): each node applies the policy
to its own home.
"""

from __future__ import annotations

from typing import Annotated

import typer

from mxq.cli import render
from mxq.cli.settings import get_settings

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count} bytes"


def gc(dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")] = False,
       json_: JsonOpt = False) -> None:
    """Apply the retention policy now: finished trainings' checkpoints, finished jobs' run files,
    stale staging files, and (when set) outputs past MXQ_KEEP_OUTPUT_DAYS and unpromoted versions
    beyond MXQ_KEEP_VERSIONS."""
    from mxq.workers.retention import collect

    removals = collect(get_settings(), dry_run=dry_run)
    if json_:
        render.print_json({"dry_run": dry_run, "removed": [r.as_dict() for r in removals],
                           "bytes": sum(r.bytes for r in removals)})
        return
    verb = "would remove" if dry_run else "removed"
    for r in removals:
        render.out.print(f"{verb} {r.what} {r.where} ({_size(r.bytes)}): {r.why}", markup=False,
                         highlight=False, soft_wrap=True)
    render.out.print(f"{verb} {len(removals)} items, {_size(sum(r.bytes for r in removals))}",
                     highlight=False)


def _pin(job_id: int, pinned: bool, json_: bool) -> None:
    from mxq.db.outputs.retention import set_pinned

    record = set_pinned(get_settings().database, job_id, pinned)
    if json_:
        render.print_json(record)
    else:
        render.out.print(f"job {job_id} {'pinned: its output is kept' if pinned else 'unpinned'}",
                         highlight=False)


def pin(job_id: Annotated[int, typer.Argument(min=1, help="The job whose output to keep.")],
        json_: JsonOpt = False) -> None:
    """Keep a job's output whatever MXQ_KEEP_OUTPUT_DAYS says."""
    _pin(job_id, True, json_)


def unpin(job_id: Annotated[int, typer.Argument(min=1, help="The job to unpin.")],
          json_: JsonOpt = False) -> None:
    """Let the retention policy remove a job's output once it is old enough."""
    _pin(job_id, False, json_)
