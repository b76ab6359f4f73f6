"""`mxq arch`: your own architectures' code (add, ls, rm), trained by name as the built-ins are.

Run on the stack's own machine, as its local admin (like `mxq users`): `add` stages the file and
waits for its trial, an `arch` job a device worker runs (so workers must be running, as for
`mxq models add` on a host that cannot load MXNet). Through the API, only an admin registers code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mxq.cli import render
from mxq.cli.settings import get_settings
from mxq.errors import UserError

app = typer.Typer(help="Your own architectures' code: add, ls, rm.", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
COLUMNS = ["name", "version", "sha256", "factory", "file_name", "classes", "input_shape", "added_by",
           "added_at"]


class ArchRefused(UserError):
    """The trial refused the code (the message is its job's one line), or never ran it."""


@app.command()
def add(name: Annotated[str, typer.Argument(help="The name `mxq train NAME DATASET` takes.")],
        file: Annotated[Path, typer.Argument(help="One Python file defining the factory.", metavar="FILE.py")],  # noqa: E501
        factory: Annotated[str, typer.Option(help="The function that builds the net: FUNC(classes: int, input_shape: tuple[int, ...]) -> gluon.HybridBlock.")],  # noqa: E501
        input_shape: Annotated[str, typer.Option(help="One sample's shape for the trial forward: 1,8,8 or 64.")],  # noqa: E501
        classes: Annotated[int, typer.Option(help="Classes for the trial forward.")] = 10,
        json_: JsonOpt = False) -> None:
    """Register FILE.py as architecture NAME (its next version): a worker imports it in a child
    process, builds the net with --factory, forwards random samples of --input-shape and checks
    the output is (N, --classes); the file is then stored by its checksum. Needs workers running."""
    from mxq.cli.models import parse_shape
    from mxq.db.reports.history import require_job
    from mxq.users import local_owner
    from mxq.workers.jobs.archs import queue_trial

    s = get_settings()
    try:
        code = file.read_bytes()
    except OSError as exc:
        raise ArchRefused(f"arch {name}: cannot read {file}: {exc.strerror}") from None
    shape = parse_shape(input_shape) or ()
    job_id = queue_trial(s, name, code, file.name, factory, classes, list(shape), local_owner())
    render.wait_for(job_id, lambda i: require_job(s.database, i), None)
    job = require_job(s.database, job_id)
    if job["status"] != "succeeded" or job["result"] is None:
        raise ArchRefused(job["error"] or f"arch {name}: trial job {job_id} {job['status']}")
    record = job["result"]["arch"]
    if json_:
        render.print_json(record)
    else:
        render.out.print(f"added arch {record['name']} version {record['version']} "
                         f"({record['file_name']}, {record['factory']}, sha256 "
                         f"{record['sha256'][:12]}); train it: mxq train {record['name']} DATASET "
                         "--name MODEL", markup=False, highlight=False)


@app.command("ls")
def list_archs(json_: JsonOpt = False) -> None:
    """Every registered architecture's versions (a training of NAME uses its newest)."""
    from mxq.db.registry import list_archs as listed

    rows = listed(get_settings().database)
    if json_:
        render.print_json(rows)
    else:
        render.table([{**r, "sha256": r["sha256"][:12]} for r in rows], COLUMNS, "architectures")


@app.command("rm")
def remove(name: str) -> None:
    """Forget architecture NAME (every version); trainings already submitted keep its code."""
    from mxq.db.registry import remove_arch

    removed = remove_arch(get_settings().database, name)
    render.out.print(f"removed arch {name} ({removed} version{'s' if removed != 1 else ''})",
                     highlight=False)
