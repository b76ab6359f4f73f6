"""`mxq schedule`: retraining on a cron schedule, with promotion of the better model."""

from __future__ import annotations

from typing import Annotated

import typer

from mxq.cli import options, render
from mxq.cli.models import parse_shape
from mxq.cli.options import PreemptibleOpt, PriorityOpt, TeamOpt, VariantsOpt, parse_variants
from mxq.cli.settings import get_settings
from mxq.priorities import Priority

app = typer.Typer(help="Scheduled retraining: add, list, show, pause, resume, rm, run-now.",
                  no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
COLUMNS = ["name", "cron", "tz", "dataset", "promote", "enabled", "next_fire_at", "last_fire_at"]
FIRE_COLUMNS = ["fire_time", "manual", "missed", "dataset_file", "job_id", "job_status", "decision",
                "reason", "error"]


@app.command()
def add(name: str,
        cron: Annotated[str, typer.Option(help="Five-field cron, e.g. '0 3 * * *'.")],
        dataset: Annotated[str, typer.Option(help="File, folder or glob: the newest match is used.")],
        model: Annotated[str, typer.Option(help="Model name the retraining registers.")],
        arch: Annotated[str | None, typer.Option(help="mlp, lenet, resnet18_v1 or one of `mxq arch ls` (or --from).")] = None,  # noqa: E501
        from_model: options.FromOpt = None, reinit: options.ReinitOpt = False,
        scale: options.ScaleOpt = None, mean: options.MeanOpt = None, std: options.StdOpt = None,
        layout: options.LayoutOpt = None,
        tz: Annotated[str, typer.Option(help="IANA time zone of the cron times.")] = "UTC",
        promote: Annotated[str, typer.Option(help="always, if-better or never")] = "if-better",
        metric: Annotated[str, typer.Option(help="Metric compared for if-better.")] = "val_accuracy",
        min_gain: Annotated[float, typer.Option(help="How much better the new one must be.")] = 0.0,
        min_metric: Annotated[float | None, typer.Option(help="The promotion floor: a version whose --metric is below it is registered and never promoted, whatever --promote says.")] = None,  # noqa: E501
        devices: int = 1, device: Annotated[str | None, typer.Option(help="gpu:0,gpu:1")] = None,
        nodes: Annotated[int, typer.Option(help="Train on N nodes (dist_sync), --devices K each.")] = 1,
        epochs: int = 10, batch_size: int = 64, lr: float = 0.1, optimizer: str = "sgd",
        momentum: float | None = None, weight_decay: float = 0.0, lr_schedule: str = "constant",
        lr_step: int | None = None, lr_factor: float = 0.1,
        dtype: str = "float32", val_fraction: float = 0.2, seed: int = 0, label_column: str = "label",
        input_shape: str | None = None,
        calibration: Annotated[str | None, typer.Option(help="Rebuild the variants (--variants) of each version it promotes from these samples (as mxq models quantize --calibration).")] = None,  # noqa: E501
        min_agreement: Annotated[float | None, typer.Option(help="With --calibration: jobs with no --precision run the variant within this agreement.")] = None,  # noqa: E501
        variants: VariantsOpt = "int8",
        json_: JsonOpt = False, priority: PriorityOpt = "normal",
        preemptible: PreemptibleOpt = None, team: TeamOpt = None,
        time_limit: options.TimeLimitOpt = None) -> None:
    """Add a schedule that retrains MODEL (an architecture, or --from a registered model's graph:
    its promoted version at each fire) from the newest DATASET file at every CRON time; its
    fires' trainings run at --priority; with --calibration, served precision follows the
    promoted version (its variants are rebuilt)."""
    from mxq.workers.schedules.fires import add_schedule

    spec = {"arch": arch, "name": model, **options.from_fields(from_model), "reinit": reinit,
            **options.preprocess_fields(scale, mean, std, layout), "devices": devices, "nodes": nodes,
            "device_list": [d.strip() for d in device.split(",")] if device else None,
            "epochs": epochs, "batch_size": batch_size, "lr": lr, "optimizer": optimizer,
            "momentum": momentum, "weight_decay": weight_decay, "lr_schedule": lr_schedule,
            "lr_step": lr_step, "lr_factor": lr_factor,
            "dtype": dtype, "val_fraction": val_fraction, "seed": seed, "label_column": label_column,
            "input_shape": list(parse_shape(input_shape) or ()) if input_shape else None,
            "calibration": calibration, "min_agreement": min_agreement,
            "variants": parse_variants(variants), "time_limit": options.parse_time_limit(time_limit)}
    record = add_schedule(get_settings(), name, cron, tz, dataset, spec, promote, metric, min_gain,
                          priority=Priority.of(priority, preemptible), team=team,
                          min_metric=min_metric)
    if json_:
        render.print_json(record)
    else:
        render.out.print(f"schedule {name}: next fire {record['next_fire_at']}")


@app.command("list")
def list_(json_: JsonOpt = False) -> None:
    """Every schedule with its next fire time."""
    from mxq.db import schedules

    rows = schedules.list_schedules(get_settings().database)
    if json_:
        render.print_json(rows)
    else:
        render.table(rows, COLUMNS, "schedules")


@app.command()
def show(name: str, json_: JsonOpt = False) -> None:
    """One schedule and its fires, with their jobs, outcomes and promotion decisions."""
    from mxq.db import schedules

    s = get_settings()
    record = schedules.detail(s.database, name)
    if json_:
        render.print_json(record)
        return
    render.job_detail({k: v for k, v in record.items() if k != "fires"}, title=f"schedule {name}")
    render.table([{**f, **(f["promotion"] or {})} for f in record["fires"]], FIRE_COLUMNS, "fires")


@app.command()
def pause(name: str) -> None:
    """Stop firing until resumed."""
    from mxq.db import schedules

    schedules.set_enabled(get_settings().database, name, False)
    render.out.print(f"schedule {name} paused")


@app.command("resume")
def resume_cmd(name: str) -> None:
    """Fire again from the next cron time (fires missed while paused are skipped)."""
    from mxq.workers.schedules.fires import resume

    resume(get_settings(), name)
    render.out.print(f"schedule {name} resumed")


@app.command()
def rm(name: str) -> None:
    """Delete the schedule; its fires stay as the history of the jobs they started."""
    from mxq.db import schedules

    schedules.remove(get_settings().database, name)
    render.out.print(f"schedule {name} removed")


@app.command("run-now")
def run_now_cmd(name: str, json_: JsonOpt = False) -> None:
    """Fire once, now."""
    from mxq.db import schedules
    from mxq.workers.schedules.fires import run_now

    s = get_settings()
    fire_id = run_now(s, name)
    fire = next(f for f in reversed(schedules.fires(s.database, name)) if f["manual"])
    if json_:
        render.print_json({"fire_id": fire_id, **fire})
    elif fire["error"]:
        render.err.print(f"mxq: fire failed: {fire['error']}", markup=False)
        raise typer.Exit(1)
    else:
        render.out.print(f"fired {name}: job {fire['job_id']} on {fire['dataset_file']}")
