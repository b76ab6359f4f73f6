"""`mxq schedule`: retraining on a cron schedule, with promotion of the better model; and
inference that scores each new file of an input once (`--infer`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mxq.cli import options, render
from mxq.cli.models import parse_shape
from mxq.cli.options import PreemptibleOpt, PriorityOpt, TeamOpt, VariantsOpt, parse_variants
from mxq.cli.settings import get_settings
from mxq.priorities import Priority

app = typer.Typer(help="Scheduled retraining and inference: add, list, show, pause, resume, rm, run-now.",
                  no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
COLUMNS = ["name", "kind", "cron", "tz", "dataset", "promote", "enabled", "next_fire_at",
           "last_fire_at"]
FIRE_COLUMNS = ["fire_time", "manual", "missed", "dataset_file", "job_id", "job_status", "decision",
                "reason", "error"]
INFER_FIRE_COLUMNS = ["fire_time", "manual", "rescore_version", "scored", "jobs", "error"]


InferOpt = Annotated[str | None, typer.Option(
    "--infer", help="Inference instead of a retraining: score each new file of --input with MODEL "
    "(its promoted version) or MODEL:VERSION, once.", metavar="MODEL[:VERSION]")]
InputOpt = Annotated[str | None, typer.Option(
    "--input", help="With --infer: a glob or folder inside MXQ_DATA_ROOT, or an s3:// prefix or "
    "glob inside MXQ_S3_ALLOWED, whose every file is an input.")]
EveryOpt = Annotated[str | None, typer.Option(
    "--every", help="Fire every DURATION (10m, 1h, 1d) instead of at --cron times.")]
RescoreOpt = Annotated[str, typer.Option(
    "--rescore", help="With --infer MODEL: when another version is promoted, score the inputs "
    "again with it at once, at this priority (high, normal, low), or off.")]


def _timing(cron: str | None, every: str | None) -> str:
    """--cron EXPR or --every DURATION, exactly one, as the schedule stores it."""
    from mxq.workers.schedules.cron import every as every_text

    if (cron is None) == (every is None):
        raise typer.BadParameter("give --cron EXPR or --every DURATION (one of them)",
                                 param_hint="--cron/--every")
    return cron if cron is not None else every_text(str(every))


@app.command()
def add(name: str,
        cron: Annotated[str | None, typer.Option(help="Five-field cron, e.g. '0 3 * * *'.")] = None,
        every: EveryOpt = None,
        dataset: Annotated[str | None, typer.Option(help="File, folder or glob: the newest match is used.")] = None,  # noqa: E501
        model: Annotated[str | None, typer.Option(help="Model name the retraining registers.")] = None,
        infer: InferOpt = None, input: InputOpt = None,
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
        epochs: int = 10,
        batch_size: Annotated[str | None, typer.Option(help="Samples per batch (training: 64; --infer: 256, or auto).")] = None,  # noqa: E501
        lr: float = 0.1, optimizer: str = "sgd",
        momentum: float | None = None, weight_decay: float = 0.0, lr_schedule: str = "constant",
        lr_step: int | None = None, lr_factor: float = 0.1,
        dtype: str = "float32", val_fraction: float = 0.2, seed: int = 0, label_column: str = "label",
        input_shape: str | None = None,
        calibration: Annotated[str | None, typer.Option(help="Rebuild the variants (--variants) of each version it promotes from these samples (as mxq models quantize --calibration).")] = None,  # noqa: E501
        min_agreement: Annotated[float | None, typer.Option(help="With --calibration: jobs with no --precision run the variant within this agreement; with --infer --precision auto, as mxq infer takes it.")] = None,  # noqa: E501
        variants: VariantsOpt = "int8",
        output: Annotated[str, typer.Option(help="With --infer: db, npy, both or parquet, as mxq infer takes it.")] = "db",  # noqa: E501
        output_to: Annotated[str | None, typer.Option(help="With --infer: s3://BUCKET/PREFIX for --output parquet or npy, as mxq infer takes it.")] = None,  # noqa: E501
        engine: Annotated[str, typer.Option(help="With --infer: auto, mxnet or onnx.")] = "auto",
        precision: Annotated[str | None, typer.Option(help="With --infer: fp32, int8, fp16 or auto, as mxq infer takes it.")] = None,  # noqa: E501
        top_k: Annotated[int, typer.Option(help="With --infer: the K best classes (labels) per sample.")] = 0,
        threshold: Annotated[float | None, typer.Option(help="With --infer, a multi-label model: the labels kept per sample.")] = None,  # noqa: E501
        key: Annotated[str | None, typer.Option(help="With --infer: the array inside .npz inputs.")] = None,
        columns: Annotated[str | None, typer.Option(help="With --infer: a Parquet input's sample columns.")] = None,  # noqa: E501
        rescore: RescoreOpt = "low",
        json_: JsonOpt = False, priority: PriorityOpt = "normal",
        preemptible: PreemptibleOpt = None, team: TeamOpt = None,
        time_limit: options.TimeLimitOpt = None) -> None:
    """Add a schedule that retrains MODEL (an architecture, or --from a registered model's graph:
    its promoted version at each fire) from the newest DATASET file at every CRON time; its
    fires' trainings run at --priority; with --calibration, served precision follows the
    promoted version (its variants are rebuilt). With --infer MODEL --input GLOB, each fire
    instead scores every file of GLOB that MODEL's version has not scored yet, a job each."""
    timing, turn = _timing(cron, every), Priority.of(priority, preemptible)
    if infer is not None:
        from mxq.workers.schedules.scoring import add_infer_schedule

        glob = _inference_input(input, dataset, model, arch)
        request = {"model": infer, "output": output, "output_to": output_to, "engine": engine,
                   "precision": precision, "min_agreement": min_agreement, "top_k": top_k,
                   "threshold": threshold, "key": key, "time_limit": options.parse_time_limit(time_limit),
                   "columns": _split(columns),
                   "batch_size": _batch(batch_size, 256)}
        record = add_infer_schedule(get_settings(), name, timing, tz, glob, request,
                                    device or "auto", None if rescore == "off" else rescore,
                                    priority=turn, team=team)
    else:
        from mxq.workers.schedules.fires import add_schedule

        dataset, model = _retraining_inputs(dataset, model, input)
        spec = {"arch": arch, "name": model, **options.from_fields(from_model), "reinit": reinit,
                **options.preprocess_fields(scale, mean, std, layout), "devices": devices,
                "nodes": nodes,
                "device_list": _split(device or None),
                "epochs": epochs, "batch_size": _batch(batch_size, 64), "lr": lr,
                "optimizer": optimizer, "momentum": momentum, "weight_decay": weight_decay,
                "lr_schedule": lr_schedule, "lr_step": lr_step, "lr_factor": lr_factor,
                "dtype": dtype, "val_fraction": val_fraction, "seed": seed,
                "label_column": label_column,
                "input_shape": _shape(input_shape),
                "calibration": calibration, "min_agreement": min_agreement,
                "variants": parse_variants(variants), "time_limit": options.parse_time_limit(time_limit)}
        record = add_schedule(get_settings(), name, timing, tz, dataset, spec, promote, metric,
                              min_gain, priority=turn, team=team, min_metric=min_metric)
    if json_:
        render.print_json(record)
    else:
        render.out.print(f"schedule {name}: next fire {record['next_fire_at']}")


def _inference_input(input: str | None, dataset: str | None, model: str | None,
                     arch: str | None) -> str:
    """--input GLOB, which --infer takes instead of a retraining's options."""
    if input is None or dataset is not None or model is not None or arch is not None:
        raise typer.BadParameter("--infer MODEL takes --input GLOB (not --dataset, --model "
                                 "or --arch, which are a retraining's)", param_hint="--infer")
    return input


def _retraining_inputs(dataset: str | None, model: str | None, input: str | None
                       ) -> tuple[str, str]:
    """--dataset and --model, which a retraining takes (and not --input, an inference's)."""
    if dataset is None or model is None or input is not None:
        raise typer.BadParameter("a retraining takes --dataset and --model (or give --infer "
                                 "MODEL --input GLOB for inference)", param_hint="--dataset/--model")
    return dataset, model


def _split(text: str | None) -> list[str] | None:
    """A comma-separated option (--columns, --device) as its items."""
    return None if text is None else [item.strip() for item in text.split(",")]


def _shape(text: str | None) -> list[int] | None:
    """--input-shape as the spec stores it."""
    return list(parse_shape(text) or ()) if text else None


def _batch(text: str | None, default: int) -> int | str:
    """--batch-size as a number (or `auto`, which only inference takes); the job checks it."""
    if text is None:
        return default
    return int(text) if text.strip().lstrip("-").isdecimal() else text


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
    if record["kind"] == "infer":
        render.table(record["fires"], INFER_FIRE_COLUMNS, "fires")
    else:
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
    elif fire["scored"] is not None:
        made = ", ".join(map(str, fire["jobs"])) or "none"
        render.out.print(f"fired {name}: {fire['scored']} new files of {fire['dataset_file']} "
                         f"scored, jobs: {made}")
    else:
        render.out.print(f"fired {name}: job {fire['job_id']} on {fire['dataset_file']}")
