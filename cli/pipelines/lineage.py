"""`mxq lineage`: what produced a prediction set, which sets a model version produced, which
inputs of an inference schedule a version has not scored yet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from mxq.cli import render
from mxq.cli.settings import get_settings

if TYPE_CHECKING:
    from mxq.workers.settings import Settings

COLUMNS = ["job_id", "status", "model", "model_version", "variant", "engine", "input", "output",
           "schedule", "finished_at"]


def lineage(job_id: Annotated[int | None, typer.Argument(help="An inference job.", show_default=False)] = None,  # noqa: E501
            model: Annotated[str | None, typer.Option("--model", help="NAME or NAME:VERSION: the prediction sets it produced.", show_default=False)] = None,  # noqa: E501
            output: Annotated[str | None, typer.Option("--output", help="A prediction file's path or s3:// URL: the job that wrote it.", show_default=False)] = None,  # noqa: E501
            unscored: Annotated[str | None, typer.Option("--unscored", help="An inference schedule: the files of its input whose bytes the version it scores with (--version to name one) has not scored.", show_default=False)] = None,  # noqa: E501
            version: Annotated[int | None, typer.Option("--version", min=1, help="With --unscored: this version instead of the promoted one.", show_default=False)] = None,  # noqa: E501
            json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False) -> None:
    """What produced a prediction set (JOB), the sets a model version produced (--model), the
    job that wrote an output (--output), or the inputs a version has not scored (--unscored)."""
    asked = [a for a in (job_id, model, output, unscored) if a is not None]
    if len(asked) != 1 or (version is not None and unscored is None):
        raise typer.BadParameter("give one of JOB, --model NAME[:VERSION], --output LOCATION or "
                                 "--unscored SCHEDULE (--version goes with --unscored)")
    s = get_settings()
    if unscored is not None:
        _unscored(s, unscored, version, json_)
    elif job_id is not None:
        _of_job(s, job_id, json_)
    else:
        _prediction_sets(s, model, output, json_)


def _unscored(s: Settings, schedule: str, version: int | None, json_: bool) -> None:
    """The files of an inference schedule's input that `version` (default: its own) has not scored."""
    from mxq.workers.schedules.scoring import unscored as missing

    scoring_version, files = missing(s, schedule, version)
    _show({"schedule": schedule, "version": scoring_version, "inputs": files}, files,
          ["location", "size"], json_, f"inputs version {scoring_version} has not scored")


def _of_job(s: Settings, job_id: int, json_: bool) -> None:
    """What produced one job's prediction set."""
    from mxq.db.lineage import lineage as read

    record = read.of_job(s.database, job_id)
    if json_:
        render.print_json(record)
    else:
        render.job_detail(_shown(record), title=f"lineage of job {job_id}")


def _prediction_sets(s: Settings, model: str | None, output: str | None, json_: bool) -> None:
    """The sets a model (or one version of it) produced, or the one written to `output`."""
    from mxq.db.lineage import lineage as read

    if model is not None:
        name, _, pinned = model.partition(":")
        if pinned and not pinned.isdecimal():
            raise typer.BadParameter(f"{model!r}: expected NAME or NAME:VERSION", param_hint="--model")
        rows, more = read.prediction_sets(s.database, name, int(pinned) if pinned else None)
    else:
        rows, more = read.prediction_sets(s.database, output=output)
    _show(rows, [_shown(r) for r in rows], COLUMNS, json_, "prediction sets")
    if more:
        render.err.print(f"mxq: the first {len(rows):,} sets; more follow (the view "
                         "prediction_lineage, or GET /api/v1/lineage?after=JOB, holds them all)",
                         markup=False)


def _shown(record: Mapping[str, object]) -> dict[str, object]:
    """A lineage row as a table shows it: an output `mxq gc` removed says so where it is named."""
    if record.get("output_removed_at"):
        return {**record, "output": f"{record['output']} (removed by mxq gc at "
                                    f"{record['output_removed_at']})"}
    return dict(record)


def _show(document: object, rows: Sequence[Mapping[str, object]], columns: list[str], json_: bool,
          title: str) -> None:
    if json_:
        render.print_json(document)
    else:
        render.table(rows, columns, title)
