"""The `mxq` command. Each command forwards to one library function and renders its answer."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from mxq.cli import archs as archs_cli
from mxq.cli import demo as demo_cli
from mxq.cli import gc as gc_cli
from mxq.cli import logs as logs_cli
from mxq.cli import models as models_cli
from mxq.cli import render
from mxq.cli import teams as teams_cli
from mxq.cli import users as users_cli
from mxq.cli.errors import EXIT_JOB_FAILED, EXIT_USAGE, describe, exit_code
from mxq.cli.options import (
    AfterOpt,
    FromOpt,
    LayoutOpt,
    MeanOpt,
    PreemptibleOpt,
    PriorityOpt,
    ReinitOpt,
    ScaleOpt,
    StdOpt,
    TeamOpt,
    TimeLimitOpt,
    VariantsOpt,
    from_fields,
    parse_after,
    parse_time_limit,
    parse_variants,
    preprocess_fields,
)
from mxq.cli.pipelines import lineage as lineage_cli
from mxq.cli.pipelines import schedule as schedule_cli
from mxq.cli.pipelines import webhooks as hooks_cli
from mxq.cli.settings import get_settings
from mxq.names import MAX_ID
from mxq.priorities import Priority
from mxq.since import parse_since
from mxq.status import FINISHED, UNSUCCESSFUL, JobStatus

if TYPE_CHECKING:
    from mxq.db.records import JobRecord
    from mxq.workers.launch.launcher import WorkerSpec
    from mxq.workers.settings import Settings

# Each command imports what it uses (SQLAlchemy, Celery, Redis, NumPy) when it runs, so that
# `mxq --help` and the commands that only read or submit start fast; tests/house/test_cli_start.py
# keeps the heavy modules out of `import mxq.cli.main`.

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="mxq: batch deep-learning jobs on pinned GPU/CPU workers.")
app.add_typer(models_cli.app, name="models")
app.add_typer(schedule_cli.app, name="schedule")
app.add_typer(users_cli.app, name="users")
app.add_typer(teams_cli.app, name="teams")
app.add_typer(archs_cli.app, name="arch")
app.add_typer(hooks_cli.app, name="hooks")


def _print_version(asked: bool) -> None:
    """`mxq --version`: the installed package's version, from its metadata (one source)."""
    if asked:
        from importlib.metadata import version

        render.out.print(f"mxq {version('mxq')}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print mxq's version and exit.")] = False) -> None:
    pass

app.command()(demo_cli.demo)
app.command()(gc_cli.gc)
app.command()(gc_cli.pin)
app.command()(gc_cli.unpin)
app.command()(logs_cli.logs)
app.command()(lineage_cli.lineage)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
KeyOpt = Annotated[str | None, typer.Option(
    "--idempotency-key", help="Makes a retry safe: a submit with a key used before shows the job "
    "that first submit made instead of queuing another (a UUID fits).")]
JobId = Annotated[int, typer.Argument(min=1, max=MAX_ID, help="A job's id.")]
DEVICE_COLUMNS = ["device", "node", "queue", "worker", "alive", "queued", "running",
                  "current_job", "leased_by", "heartbeat_age", "oldest_wait_seconds", "health",
                  "memory"]
JOB_COLUMNS = ["id", "kind", "status", "owner", "priority", "device", "node", "progress",
               "samples_per_sec", "attempts", "submitted_at", "error"]
CSV_COLUMNS = ["id", "kind", "status", "device", "node", "worker", "queue", "attempts", "progress",
               "samples", "seconds", "samples_per_sec", "submitted_at", "started_at", "finished_at",
               "model", "model_version", "parent_id", "error", "owner", "priority", "preemptions"]
QUEUE_COLUMNS = ["position", "id", "kind", "priority", "owner", "queue", "submitted_at", "why"]
QUEUE_LOOK = 1000  # how far `mxq job` looks into the queue for a waiting job's reason


def _since(text: str | None) -> datetime | None:
    return None if text is None else parse_since(text, datetime.now(UTC))


@app.command()
def up(detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once all workers answer.")] = False,  # noqa: E501
       timeout: float = 180.0) -> None:
    """Start the stack: embedded Redis (unless MXQ_BROKER_URL is set), schema, one worker per device."""
    from mxq.workers.fleet.device_table import device_table
    from mxq.workers.launch.embedded import EmbeddedRedis
    from mxq.workers.launch.stack import preflight, prepare, run_launcher, up_detached

    s = get_settings(own=True)
    for note in preflight(s):  # refuses a running stack or a taken port; ends orphans
        render.err.print(f"mxq: {note}", markup=False)
    started, changed = prepare(s)
    for note in changed:  # a setting of the stack given anew: it wins, and is announced
        render.err.print(f"mxq: {note}", markup=False)
    specs = _plan_or_exit(s)
    if detach:
        for refusal in up_detached(s, specs, timeout):
            render.err.print(f"mxq: refused {refusal}", markup=False)
        _device_table(device_table(s))
        render.out.print(f"dashboard and API: http://{s.api_host}:{s.api_port}/")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    code = run_launcher(s, specs, with_schedule=True)
    if started:
        EmbeddedRedis(s.home_path).stop()
    raise typer.Exit(code)


def _plan_or_exit(s: Settings) -> list[WorkerSpec]:
    from mxq.workers.launch.stack import node_plan

    specs, refused = node_plan(s)
    for problem in refused:
        render.err.print(f"mxq: refusing {problem}", markup=False)
    if not specs:
        render.err.print("mxq: no usable device on this node", markup=False)
        raise typer.Exit(1)
    return specs


@app.command()
def down() -> None:
    """Stop everything `mxq up` started (by PID)."""
    from mxq.workers.launch.stack import down as stop

    stopped, notes = stop(get_settings())
    for note in notes:
        render.err.print(f"mxq: {note}", markup=False)
    render.out.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


def _shown_env(key: str, value: str) -> str:
    """An environment value fit to print: the token masked, passwords out of the URLs."""
    from kombu.utils.url import maybe_sanitize_url

    from mxq.db.engine import safe_url

    if key == "MXQ_API_TOKEN":
        return "**********"
    if key == "MXQ_DATABASE_URL":
        return safe_url(value)
    if key == "MXQ_BROKER_URL":
        return str(maybe_sanitize_url(value))
    return value


@app.command()
def worker(node: Annotated[str | None, typer.Option(help="Node name (default MXQ_NODE or host name).")] = None,  # noqa: E501
           dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the workers it would start.")] = False,  # noqa: E501
           with_schedule: Annotated[bool, typer.Option("--with-schedule", hidden=True)] = False,
           json_: JsonOpt = False) -> None:
    """Start and supervise one pinned Celery worker per device of this node."""
    from mxq.workers.launch.stack import check_node_free, prepare, run_launcher

    s = get_settings(own=True, node=node)
    if dry_run:
        from mxq.workers.launch.stack import node_plan

        specs, refused = node_plan(s)
        plan: list[dict[str, Any]] = [
            {"worker": w.name, "device": w.device.label if w.device else None,
             "queues": w.queues, "cores": w.cores,
             "engines": list(w.engines),
             "command": w.command, "env": {k: _shown_env(k, v) for k, v in w.env.items()
                                           if k.startswith(("MXQ_", "CUDA_", "OMP_", "MXNET_"))}}
            for w in specs]
        if json_:
            render.print_json({"workers": plan, "refused": refused})
        else:
            for problem in refused:
                render.err.print(f"mxq: refusing {problem}", markup=False)
            render.table([{**w, "engines": ", ".join(w["engines"])} for w in plan],
                         ["worker", "device", "queues", "cores", "engines"], "workers")
        raise typer.Exit(0 if specs else 1)
    for note in check_node_free(s):  # before anything starts
        render.err.print(f"mxq: {note}", markup=False)
    specs = _plan_or_exit(s)
    for note in prepare(s)[1]:
        render.err.print(f"mxq: {note}", markup=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raise typer.Exit(run_launcher(s, specs, with_schedule))


@app.command()
def api() -> None:
    """The HTTP API and dashboard on MXQ_API_HOST:MXQ_API_PORT (default 127.0.0.1:8470)."""
    import uvicorn

    s = get_settings()
    if s.api_token is None:
        if not s.api_on_loopback:
            render.err.print(f"mxq: refusing to serve on {s.api_host} without MXQ_API_TOKEN: set a "
                             "token, or use a loopback address", markup=False)
            raise typer.Exit(EXIT_USAGE)
        render.err.print("mxq: no MXQ_API_TOKEN set: listening on loopback only (every request "
                         "needs a user's token once any user has one)", markup=False)
    render.err.print(f"mxq: API and dashboard on http://{s.api_host}:{s.api_port}/", markup=False)
    uvicorn.run("mxq.api.app:app", host=s.api_host, port=s.api_port, log_level="warning")


@app.command()
def stats(by: Annotated[str, typer.Option(help="device, model or day")] = "device",
          json_: JsonOpt = False) -> None:
    """Throughput and success rates per device, model or day."""
    from mxq.db.reports.history import stats as compute

    if by not in ("device", "model", "day"):
        raise typer.BadParameter(f"{by!r}: expected device, model or day", param_hint="--by")
    rows = compute(get_settings().database, by)
    if json_:
        render.print_json(rows)
    else:
        render.table(rows, [by, "jobs", *FINISHED, "success_rate", "samples", "samples_per_sec"],
                     f"stats by {by}")


@app.command()
def scheduler() -> None:
    """The schedule process alone (Celery beat and the tick), as docker-compose runs it."""
    import os

    from mxq.workers.launch.launcher import schedule_spec

    spec = schedule_spec(get_settings())
    os.execvpe(spec.command[0], spec.command, spec.env)


@app.command()
def reconcile(json_: JsonOpt = False) -> None:
    """One reconciler pass now: republish lost messages, requeue dead jobs, free stale leases."""
    from dataclasses import asdict

    from mxq.workers.repair.reconcile import reconcile as run_pass

    report = asdict(run_pass(get_settings()))
    if json_:
        render.print_json(report)
    else:
        for action, items in report.items():
            render.out.print(f"{action.replace('_', ' ')}: {', '.join(map(str, items)) or 'none'}")


@app.command("dead-letters")
def dead_letters(clear: Annotated[bool, typer.Option("--clear", help="Drop them all.")] = False,
                 json_: JsonOpt = False) -> None:
    """Broker messages no worker could read, moved aside (newest first): their queue, when, why."""
    from mxq.workers.broker import deadletters
    from mxq.workers.broker.redis_client import client as broker_client

    client = broker_client(get_settings().broker)
    if clear:
        render.out.print(f"cleared {deadletters.clear(client)} dead letters")
        return
    rows = deadletters.listed(client)
    if json_:
        render.print_json(rows)
    else:
        render.table([{**r, "message": r["message"][:60]} for r in rows],
                     ["at", "queue", "reason", "chars", "message"], "dead letters")


@app.command()
def migrate() -> None:
    """Bring the database to the newest schema (Alembic migrations; idempotent)."""
    from mxq.db.engine import safe_url
    from mxq.db.migrate import current_revision, upgrade

    s = get_settings()
    s.home_path.mkdir(parents=True, exist_ok=True)
    applied = upgrade(s.database)
    where = f"database {safe_url(s.database)}"
    if applied:
        render.out.print(f"{where}: applied {len(applied)} migration(s), {', '.join(applied)}; "
                         f"now at {applied[-1]}, the newest schema", soft_wrap=True)
    else:
        render.out.print(f"{where} is at the newest schema ({current_revision(s.database)}): "
                         "nothing to apply", soft_wrap=True)


@app.command()
def probe(device: Annotated[str, typer.Option(help="auto, gpu:N or cpu:N")] = "auto",
          size: Annotated[int, typer.Option(help="Matrix side for the multiply.")] = 1024,
          batch: Annotated[int, typer.Option(help="Images per convolution batch.")] = 32,
          repeat: Annotated[int, typer.Option(help="Timed rounds of each benchmark.")] = 5,
          allow_offline: Annotated[bool, typer.Option("--allow-offline", help="Queue even if the device has no live worker.")] = False,  # noqa: E501
          wait: Annotated[bool, typer.Option("--wait", help="Show progress, then the outcome.")] = False,
          json_: JsonOpt = False, idempotency_key: KeyOpt = None, priority: PriorityOpt = "normal",
          preemptible: PreemptibleOpt = None, team: TeamOpt = None,
          time_limit: TimeLimitOpt = None, after: AfterOpt = None) -> None:
    """Queue a probe: matmul and convolution GFLOP/s and memory figures of one device."""
    _submit_and_report("probe", {"size": size, "batch": batch, "repeat": repeat,
                                 "time_limit": parse_time_limit(time_limit)}, device,
                       allow_offline, wait, json_, idempotency_key, (priority, preemptible),
                       team, parse_after(after))


@app.command()
def infer(model: Annotated[str, typer.Argument(help="NAME or NAME:VERSION")],
          input: Annotated[str, typer.Argument(help="Input inside MXQ_DATA_ROOT (.npy, .npz, .csv, .parquet, image folder, .rec), or s3://BUCKET/KEY inside MXQ_S3_ALLOWED (.npy, .npz, .csv, .parquet)")],  # noqa: E501
          device: Annotated[str, typer.Option(help="auto, gpu:N or cpu:N")] = "auto",
          batch_size: Annotated[str, typer.Option(help="Samples per batch, or auto: the largest that fits the device.")] = "256",  # noqa: E501
          output: Annotated[str, typer.Option(help="db (SQL rows), npy, both (db and npy) or parquet: $MXQ_HOME/outputs/STACK/job-ID.npy or .parquet (STACK: the stack id).")] = "db",  # noqa: E501
          engine: Annotated[str, typer.Option(help="auto, mxnet or onnx (auto: the one measured faster for this model on this kind of device).")] = "auto",  # noqa: E501
          precision: Annotated[str | None, typer.Option(help="fp32, int8 or fp16 (the version's variant of that precision), or auto: the fastest variant whose agreement with float32 meets --min-agreement, only where it measured faster here; unset: as the version was quantized, else fp32.")] = None,  # noqa: E501
          min_agreement: Annotated[float | None, typer.Option(help="With --precision auto: the least argmax agreement with float32 (held-out calibration samples) a variant must have shown, e.g. 0.99.")] = None,  # noqa: E501
          top_k: Annotated[int, typer.Option(help="Also store the K best classes per sample (a multi-label model: keep its K best labels).")] = 0,  # noqa: E501
          threshold: Annotated[float | None, typer.Option(help="A multi-label model: keep the labels whose probability is at least this (default 0.5 unless --top-k).")] = None,  # noqa: E501
          chunk_size: Annotated[int | None, typer.Option(help="Split into chunk jobs of N samples over devices.")] = None,  # noqa: E501
          key: Annotated[str | None, typer.Option(help="Array name inside an .npz input.")] = None,
          output_to: Annotated[str | None, typer.Option(help="s3://BUCKET/PREFIX (inside MXQ_S3_ALLOWED) that a --output parquet or npy job writes PREFIX/STACK/job-ID.parquet or .npy to (STACK: the stack id), instead of $MXQ_HOME/outputs.")] = None,  # noqa: E501
          columns: Annotated[str | None, typer.Option(help="A Parquet input's sample: one list column, or numeric columns A,B,C (default: its only list column, else all its columns).")] = None,  # noqa: E501
          reject_nan: Annotated[bool, typer.Option("--reject-nan", help="Kept for scripts: NaN and infinite inputs always fail the job, naming the sample.")] = False,  # noqa: E501
          allow_offline: Annotated[bool, typer.Option("--allow-offline")] = False,
          wait: Annotated[bool, typer.Option("--wait", help="Show progress, then the outcome.")] = False,
          json_: JsonOpt = False, idempotency_key: KeyOpt = None, priority: PriorityOpt = "normal",
          preemptible: PreemptibleOpt = None, team: TeamOpt = None,
          time_limit: TimeLimitOpt = None, after: AfterOpt = None) -> None:
    """Queue bulk inference of MODEL over INPUT; every prediction is stored."""
    params = {"model": model, "input": input,
              "batch_size": int(batch_size) if batch_size.lstrip("-").isdigit() else batch_size,
              "output": output, "engine": engine, "precision": precision,
              "min_agreement": min_agreement, "top_k": top_k, "threshold": threshold,
              "chunk_size": chunk_size, "key": key, "reject_nan": reject_nan,
              "columns": None if columns is None else [c.strip() for c in columns.split(",")],
              "output_to": output_to, "time_limit": parse_time_limit(time_limit)}
    _submit_and_report("infer", params, device, allow_offline, wait, json_, idempotency_key,
                       (priority, preemptible), team, parse_after(after))


@app.command()
def results(job_id: JobId,
            format: Annotated[str, typer.Option("--format", help="table, json, csv, parquet (with --out) or npy (with --values and --out)")] = "table",  # noqa: E501
            out: Annotated[Path | None, typer.Option("--out", help="The file --format parquet or npy writes.")] = None,  # noqa: E501
            values: Annotated[str | None, typer.Option("--values", help="The output whose values --format npy --out FILE writes, (rows, width) float32: `output` for a model's only one, or one of several by name.")] = None,  # noqa: E501
            limit: Annotated[int | None, typer.Option(min=1, max=MAX_ID)] = None,
            offset: Annotated[int, typer.Option(min=0, max=MAX_ID)] = 0) -> None:
    """The predictions of an inference job (CSV: index,predicted_class,score[,top-k]), all of
    them exported as a Parquet file (`--format parquet --out FILE`), or one output's values as
    an .npy (`--values NAME --format npy --out FILE`: an embedding, regression values)."""
    from mxq.db.outputs import results as stored
    from mxq.db.reports.history import require_job

    if format not in ("table", "json", "csv", "parquet", "npy"):
        raise typer.BadParameter(f"{format!r}: expected table, json, csv, parquet or npy",
                                 param_hint="--format")
    if (format in ("parquet", "npy")) != (out is not None) or (format == "npy") != (values is not None):
        raise typer.BadParameter("--out FILE goes with --format parquet, or npy with --values NAME, "
                                 "and only with them", param_hint="--out")
    s = get_settings()
    record = require_job(s.database, job_id)
    if out is not None and values is not None:
        _write_values(stored.values(s.database, s.home_path, record, values, limit, offset)[0],
                      out, f"output {values} of job {job_id}")
    elif out is not None:
        rows = stored.export_parquet(s.database, s.home_path, record, out, limit, offset)
        render.err.print(f"wrote {rows} predictions of job {job_id} to {out}", markup=False)
    else:
        render.predictions(stored.read(s.database, s.home_path, record, limit, offset), format)
    if record["status"] in UNSUCCESSFUL:
        render.err.print(f"mxq: job {job_id} {record['status']}: {record['error']}", markup=False)
        raise typer.Exit(EXIT_JOB_FAILED)


def _write_values(array: Any, out: Path, what: str) -> None:
    import numpy as np

    with out.open("wb") as f:  # np.save would add .npy to another name
        np.save(f, array, allow_pickle=False)
    render.err.print(f"wrote {len(array)} rows of {what} ({array.shape[1]} values each) to {out}",
                     markup=False)


@app.command()
def train(arch: Annotated[str, typer.Argument(help="mlp, lenet, resnet18_v1 or one of `mxq arch ls` (none with --from)", metavar="[ARCH]")],  # noqa: E501
          dataset: Annotated[str | None, typer.Argument(help="digits, .npz (X, y), .csv, image folder or .rec", show_default=False)] = None,  # noqa: E501
          name: Annotated[str | None, typer.Option("--name", help="Model name the result registers as (default with --from: that model's).")] = None,  # noqa: E501
          from_model: FromOpt = None, reinit: ReinitOpt = False,
          scale: ScaleOpt = None, mean: MeanOpt = None, std: StdOpt = None, layout: LayoutOpt = None,
          devices: Annotated[int, typer.Option("--devices", help="K devices of one node.")] = 1,
          device: Annotated[str | None, typer.Option("--device", help="Exact devices (gpu:0,gpu:1), or any of a kind (auto:gpu).")] = None,  # noqa: E501
          nodes: Annotated[int, typer.Option("--nodes", help="Train on N nodes (dist_sync), K devices each.")] = 1,  # noqa: E501
          epochs: int = 10, batch_size: Annotated[int, typer.Option(help="Global batch size.")] = 64,
          lr: float = 0.1, optimizer: Annotated[str, typer.Option(help="sgd, adam or nag")] = "sgd",
          momentum: Annotated[float | None, typer.Option(help="sgd and nag: the momentum (unset: 0.9).")] = None,  # noqa: E501
          weight_decay: Annotated[float, typer.Option(help="L2 weight decay.")] = 0.0,
          lr_schedule: Annotated[str, typer.Option(help="constant, step (times --lr-factor every --lr-step epochs) or cosine (down to 0 over the epochs).")] = "constant",  # noqa: E501
          lr_step: Annotated[int | None, typer.Option(help="step: epochs between steps (unset: a third of the epochs).")] = None,  # noqa: E501
          lr_factor: Annotated[float, typer.Option(help="step: the learning rate's factor at each step.")] = 0.1,  # noqa: E501
          dtype: Annotated[str, typer.Option(help="float32 or float16 (GPUs)")] = "float32",
          val_fraction: float = 0.2, seed: int = 0,
          label_column: Annotated[str, typer.Option(help="CSV column holding the label.")] = "label",
          input_shape: Annotated[str | None, typer.Option(help="Image datasets: C,H,W")] = None,
          calibration: Annotated[str | None, typer.Option(help="Build the trained version's variants (--variants) from these samples (as mxq models quantize --calibration).")] = None,  # noqa: E501
          min_agreement: Annotated[float | None, typer.Option(help="With --calibration: jobs with no --precision run the variant within this agreement.")] = None,  # noqa: E501
          variants: VariantsOpt = "int8",
          allow_offline: Annotated[bool, typer.Option("--allow-offline")] = False,
          wait: Annotated[bool, typer.Option("--wait", help="Show progress, then the outcome.")] = False,
          json_: JsonOpt = False, idempotency_key: KeyOpt = None, priority: PriorityOpt = "normal",
          preemptible: PreemptibleOpt = None, team: TeamOpt = None,
          time_limit: TimeLimitOpt = None, after: AfterOpt = None) -> None:
    """Queue data-parallel training of ARCH (or, with --from, of a registered model's own graph) on
    DATASET over K devices (of N nodes); registers a version of NAME."""
    route, device_list = _train_devices(device)
    source, data = _arch_and_dataset(arch, dataset, from_model)
    params = {"arch": source, "dataset": data, "name": name or "", "devices": devices, "nodes": nodes,
              **from_fields(from_model), "reinit": reinit,
              **preprocess_fields(scale, mean, std, layout),
              "device_list": device_list, "epochs": epochs, "batch_size": batch_size, "lr": lr,
              "optimizer": optimizer, "momentum": momentum, "weight_decay": weight_decay,
              "lr_schedule": lr_schedule, "lr_step": lr_step, "lr_factor": lr_factor,
              "dtype": dtype, "val_fraction": val_fraction, "seed": seed,
              "label_column": label_column,
              "input_shape": list(models_cli.parse_shape(input_shape) or ()) if input_shape else None,
              "calibration": calibration, "min_agreement": min_agreement,
              "variants": parse_variants(variants), "time_limit": parse_time_limit(time_limit)}
    _submit_and_report("train", params, route, allow_offline, wait, json_, idempotency_key,
                       (priority, preemptible), team, parse_after(after))


def _arch_and_dataset(first: str, second: str | None, from_model: str | None) -> tuple[str | None, str]:
    """`mxq train ARCH DATASET`, or `mxq train --from NAME DATASET` (no architecture)."""
    if from_model is not None:
        if second is not None:
            raise typer.BadParameter(f"--from {from_model} trains that model's graph: give DATASET "
                                     f"alone, not an architecture ({first!r}) too", param_hint="ARCH")
        return None, first
    if second is None:
        raise typer.BadParameter("give ARCH and DATASET (mxq train lenet digits --name NAME), or "
                                 "--from NAME and DATASET", param_hint="DATASET")
    return first, second


def _train_devices(device: str | None) -> tuple[str, list[str] | None]:
    """`--device` of a training: where it is routed and the devices it lists. `auto:gpu` (any
    GPU) is a route, not a list; `gpu:0,gpu:1` a list, routed to its first device."""
    from mxq.workers.broker.queues import DeviceSpecError, parse_device

    if device is None:
        return "auto", None
    entries = [d.strip() for d in device.split(",")]
    try:
        if len(entries) == 1 and parse_device(entries[0]).auto:
            return entries[0], None
    except DeviceSpecError:
        pass  # a list entry the job's validation names
    return entries[0], entries


def _submit_and_report(kind: str, params: dict[str, Any], device: str, allow_offline: bool,
                       wait: bool, json_: bool, idempotency_key: str | None,
                       turn: tuple[str, bool | None], team: str | None = None,
                       after: list[int] | None = None) -> None:
    from mxq.db.reports.history import require_job
    from mxq.workers.jobs.submit import submit_request

    s = get_settings()
    done = submit_request(s, kind, params, device, allow_offline, idempotency_key,
                          priority=Priority.of(*turn), team=team, after=after)
    job_id = done.job_id
    if not wait:
        record = require_job(s.database, job_id)
        if json_:
            render.print_json({**record, "published": done.published, "replayed": done.replayed,
                               "note": done.note})
        else:
            render.out.print(f"job {job_id} queued on {record['queue']}"
                             + (f"; {done.note}" if done.note else ""), soft_wrap=True)
        return
    if done.note:
        render.err.print(f"mxq: {done.note}", markup=False, soft_wrap=True)
    render.wait_for(job_id, lambda i: require_job(s.database, i), None)
    _show_job(require_job(s.database, job_id, with_metrics=True), json_)


def _show_job(record: JobRecord, json_: bool) -> None:
    if json_:
        render.print_json(record)
    else:
        render.job_detail(record)
    if record["status"] in UNSUCCESSFUL:
        if not json_:
            render.err.print(f"mxq: job {record['id']} {record['status']}: {record['error']}",
                             markup=False)
        raise typer.Exit(EXIT_JOB_FAILED)


def _device_table(records: list[dict[str, Any]]) -> None:
    """The device table, a device that is out saying since when and why (`health`)."""
    from mxq.db.fleet import gpu_memory, out_note

    rows = [{**r, "memory": gpu_memory(r)} for r in records]
    render.table([{**r, "health": out_note(r["out_reason"], r["out_since"])}
                  if r.get("health") == "out" else r for r in rows], DEVICE_COLUMNS, "devices")


@app.command()
def devices(json_: JsonOpt = False) -> None:
    """Every device worker: its queue, whether it is live, queued and running jobs, heartbeat,
    and its device's health (healthy, offline, or out: since when and why)."""
    from mxq.db.reports.history import pool_depths
    from mxq.workers.fleet.device_table import device_table

    s = get_settings()
    records = device_table(s)
    if json_:
        render.print_json(records)
        return
    _device_table(records)
    for queue, depth in sorted(pool_depths(s.database).items()):
        render.out.print(f"{queue}: {depth} queued")


@app.command()
def jobs(status: Annotated[str | None, typer.Option(help="queued, running, succeeded, failed, cancelled")] = None,  # noqa: E501
         kind: Annotated[str | None, typer.Option(help="Job kind, e.g. probe.")] = None,
         device: Annotated[str | None, typer.Option(help="Device it ran on, e.g. cpu:1.")] = None,
         node: Annotated[str | None, typer.Option(help="Node it ran on.")] = None,
         user: Annotated[str | None, typer.Option(help="Who submitted it: a user, local:LOGIN.")] = None,
         since: Annotated[str | None, typer.Option(help="30m, 2h, 1d or an ISO time.")] = None,
         limit: Annotated[int, typer.Option(min=1, max=100000)] = 50,
         format: Annotated[str, typer.Option("--format", help="table, json or csv")] = "table",
         json_: JsonOpt = False) -> None:
    """Job history, newest first (`--format json|csv` to export)."""
    allowed = tuple(JobStatus)
    if status is not None and status not in allowed:
        raise typer.BadParameter(f"{status!r}: expected one of {', '.join(allowed)}",
                                 param_hint="--status")
    from mxq.db.reports.history import JobFilter, list_jobs

    s = get_settings()
    rows = list_jobs(s.database, JobFilter(status, kind, device, node, _since(since), limit,
                                           owner=user))
    if format not in ("table", "json", "csv"):
        raise typer.BadParameter(f"{format!r}: expected table, json or csv", param_hint="--format")
    if json_ or format == "json":
        render.print_json(rows)
    elif format == "csv":
        render.csv_rows(rows, CSV_COLUMNS)
    else:
        render.table(rows, JOB_COLUMNS, "jobs")


@app.command()
def cancel(job_id: JobId,
           wait: Annotated[bool, typer.Option("--wait", help="Wait until it has stopped.")] = False,
           json_: JsonOpt = False) -> None:
    """Cancel a job: at once if queued, at its next batch or epoch boundary if running."""
    from mxq.db.reports.history import require_job
    from mxq.workers.jobs.cancel import MESSAGES, cancel_job

    s = get_settings()
    outcome = cancel_job(s, job_id)
    record = require_job(s.database, job_id)
    if wait:
        record = render.wait_for(job_id, lambda i: require_job(s.database, i), None)
    if json_:
        render.print_json({"outcome": outcome.value, **record})
    else:
        render.out.print(MESSAGES[outcome].format(id=job_id))


@app.command()
def job(job_id: JobId, json_: JsonOpt = False) -> None:
    """One job's full record (a waiting one also says why it waits); exits 1 when the job
    failed or was cancelled."""
    from mxq.db.reports.history import require_job
    from mxq.workers.jobs.queue_view import queue_view

    s = get_settings()
    record: dict[str, Any] = dict(require_job(s.database, job_id, with_metrics=True))
    if record["status"] == JobStatus.QUEUED:
        entry = next((e for e in queue_view(s, QUEUE_LOOK) if e["id"] == job_id), None)
        record["waiting"] = (f"{entry['why']} (position {entry['position']})" if entry else
                             f"behind the first {QUEUE_LOOK} waiting jobs")
    _show_job(cast("JobRecord", record), json_)


@app.command()
def queue(limit: Annotated[int, typer.Option(min=1, max=1000, help="The first N waiting jobs.")] = 50,
          json_: JsonOpt = False) -> None:
    """The waiting jobs in the order workers take them (priority, then a job that started
    before, then the oldest), each with why it waits."""
    from mxq.workers.jobs.queue_view import queue_view

    entries = queue_view(get_settings(), limit)
    if json_:
        render.print_json(entries)
    else:
        render.table(cast(list[dict[str, Any]], entries), QUEUE_COLUMNS, "waiting jobs")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI on `argv` (default: the process's arguments); known failures print one line
    (`mxq: error: ...`) and exit 2."""
    try:
        app(args=argv, prog_name="mxq")  # standalone: usage errors and typer.Exit end the process here
    except Exception as exc:
        message = describe(exc)
        if message is None:
            raise
        print(f"mxq: error: {message}", file=sys.stderr)
        sys.exit(exit_code(exc))
