"""Tables and JSON of the CLI, and its wait for a job (the bar is `mxq.client.progress`'s)."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mxq.client.progress import JobBar
from mxq.db.records import JobRecord, PredictionRow
from mxq.names import csv_cell, visible
from mxq.status import FINISHED

# Piped output (CI logs, `| less`) gets a wide table instead of rich's 80 columns.
WIDTH = shutil.get_terminal_size((160, 24)).columns
out = Console(width=None if sys.stdout.isatty() else WIDTH)
err = Console(stderr=True, soft_wrap=True)  # a one-line error stays one line, however long
WAIT_POLL_SECONDS = 0.25


def finite(data: object) -> object:
    """`data` with every NaN and infinity as None: JSON has no such numbers (Python's bare
    `NaN` is not JSON), and a score that is not a number is unknown (null)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def print_json(data: object) -> None:
    """Valid JSON always: non-finite numbers are written as null (`finite`)."""
    sys.stdout.write(json.dumps(finite(data), indent=2, default=str, allow_nan=False) + "\n")


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return visible(str(value))  # a file name from outside may hold a terminal's escapes


def table(rows: Sequence[Mapping[str, object]], columns: list[str], title: str | None = None) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*(Text(_fmt(r.get(c))) for c in columns))  # Text: a `[` is no markup
    out.print(t)


# The lists of a job record shown as tables of their own under it, with these columns.
JOB_LISTS = {"epochs": ["epoch", "train_loss", "train_accuracy", "val_accuracy", "samples_per_sec"],
             "events": ["at", "kind", "message"]}


def job_detail(record: Mapping[str, object], title: str | None = None) -> None:
    t = Table(show_header=False, title=title or f"job {record['id']}")
    t.add_column("field", style="bold")
    t.add_column("value")
    for key, value in record.items():
        if key in JOB_LISTS:
            continue
        if key == "metrics" and isinstance(value, list):
            value = f"{len(value)} throughput points (--json lists them)"
        if isinstance(value, dict):
            value = ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()) or "-"
        t.add_row(key, Text(_fmt(value)))
    out.print(t)
    _job_lists(record)


def _job_lists(record: Mapping[str, object]) -> None:
    """A job's epochs and events, each a table of its own."""
    for key, columns in JOB_LISTS.items():
        rows = record.get(key)
        if rows and isinstance(rows, list):
            table(rows, columns, key)


def csv_rows(rows: Sequence[Mapping[str, object]], columns: list[str]) -> None:
    """`columns` of `rows` as CSV, None as an empty cell; text that a spreadsheet would read as a
    formula (a model name `=…` of a refused submit) is written as text (`mxq.names.csv_cell`)."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow(["" if r.get(c) is None else csv_cell(r.get(c)) for c in columns])


def predictions(rows: list[PredictionRow], fmt: str) -> None:
    """Rows as a table, JSON or CSV (index,predicted_class,score, then top-k pairs when stored)."""
    if fmt == "json":
        print_json(rows)
        return
    if fmt == "csv":
        from mxq.db.outputs.results import prediction_csv  # Parquet and SQLAlchemy: only for this command

        csv.writer(sys.stdout, lineterminator="\n").writerows(prediction_csv(rows))
        return
    k = max((len(r["top_k"] or []) for r in rows), default=0)
    table([{**r, "top_k": " ".join(f"{c}:{p:.3f}" for c, p in (r["top_k"] or [])) or None}
           for r in rows], ["index", "predicted_class", "score", *(["top_k"] if k else [])])


# The exit status of a wait stopped by Ctrl-C, as a shell reports a process ended by SIGINT.
EXIT_INTERRUPTED = 130


def wait_for(job_id: int, fetch: Callable[[int], JobRecord],
             timeout: float | None) -> JobRecord:
    """Show a progress bar (on stderr) until the job is over; return its final record.

    Ctrl-C stops only the waiting, not the job: the bar (transient) is gone, so one line says
    which job goes on and how to stop it, and the command exits 130."""
    deadline = None if timeout is None else time.monotonic() + timeout
    status = "queued"
    try:
        with JobBar(job_id, console=err) as bar:
            while True:
                record = fetch(job_id)
                status = record["status"]
                bar.show(status, record["progress"])
                if status in FINISHED:
                    return record
                if deadline is not None and time.monotonic() > deadline:
                    return record
                time.sleep(WAIT_POLL_SECONDS)
    except KeyboardInterrupt:
        err.print(f"mxq: stopped waiting; job {job_id} is still {status} "
                  f"(mxq cancel {job_id} to stop it)", markup=False, highlight=False)
        raise SystemExit(EXIT_INTERRUPTED) from None
