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
from mxq.cli import submits as submits_cli
from mxq.cli import teams as teams_cli
from mxq.cli import users as users_cli
from mxq.cli.errors import EXIT_JOB_FAILED, EXIT_USAGE, describe, exit_code
from mxq.cli.options import JsonOpt
from mxq.cli.pipelines import lineage as lineage_cli
from mxq.cli.pipelines import schedule as schedule_cli
from mxq.cli.pipelines import webhooks as hooks_cli
from mxq.cli.settings import get_settings
from mxq.names import MAX_ID
from mxq.since import parse_since
from mxq.status import FINISHED, UNSUCCESSFUL, JobStatus

if TYPE_CHECKING:
    from mxq.db.records import JobRecord
    from mxq.workers.launch.recheck import NodePlan
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
app.command()(submits_cli.probe)
app.command()(submits_cli.infer)
app.command()(submits_cli.train)

JobId = Annotated[int, typer.Argument(min=1, max=MAX_ID, help="A job's id.")]
DEVICE_COLUMNS = ["device", "node", "queue", "worker", "alive", "queued", "running",
                  "current_job", "leased_by", "heartbeat_age", "oldest_wait_seconds", "health",
                  "memory", "nvml"]
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
    node = _plan_or_exit(s, keep_probing=not detach)
    specs = node.specs
    if detach:
        for refusal in up_detached(s, specs, timeout):
            render.err.print(f"mxq: refused {refusal}", markup=False)
        _device_table(device_table(s))
        render.out.print(f"dashboard and API: http://{s.api_host}:{s.api_port}/")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    code = run_launcher(s, specs, with_schedule=True, unplanned=node.unplanned)
    if started:
        EmbeddedRedis(s.home_path).stop()
    raise typer.Exit(code)


def _plan_or_exit(s: Settings, keep_probing: bool = True) -> NodePlan:
    """The node's plan, its refusals said; exit 1 with no device to start, unless a GPU refused
    or missing may come back while mxq runs (`keep_probing`: the launcher checks it again)."""
    from mxq.workers.hardware.unplanned import HEALS
    from mxq.workers.launch.recheck import node_plan

    node = node_plan(s)
    for problem in node.refused:
        render.err.print(f"mxq: refusing {problem}", markup=False)
    if not node.specs and not (keep_probing and any(u.cause in HEALS for u in node.unplanned)):
        render.err.print("mxq: no usable device on this node", markup=False)
        raise typer.Exit(1)
    if not node.specs:
        render.err.print(f"mxq: no usable device on this node now; the launcher checks its GPUs "
                         f"again every {s.reprobe_seconds:.0f}s", markup=False)
    return node


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
        from mxq.workers.launch.recheck import node_plan

        planned = node_plan(s)
        specs, unplanned, refused = planned.specs, planned.unplanned, planned.refused
        plan: list[dict[str, Any]] = [
            {"worker": w.name, "device": w.device.label if w.device else None,
             "queues": w.queues, "cores": w.cores,
             "engines": list(w.engines),
             "command": w.command, "env": {k: _shown_env(k, v) for k, v in w.env.items()
                                           if k.startswith(("MXQ_", "CUDA_", "OMP_", "MXNET_"))}}
            for w in specs]
        if json_:
            render.print_json({"workers": plan, "refused": refused, "unplanned": [
                {"device": u.device.label, "uuid": u.device.uuid or None, "cause": u.cause,
                 "reason": u.reason} for u in unplanned]})
        else:
            for problem in refused:
                render.err.print(f"mxq: refusing {problem}", markup=False)
            render.table([{**w, "engines": ", ".join(w["engines"])} for w in plan],
                         ["worker", "device", "queues", "cores", "engines"], "workers")
        raise typer.Exit(0 if specs else 1)
    for note in check_node_free(s):  # before anything starts
        render.err.print(f"mxq: {note}", markup=False)
    planned = _plan_or_exit(s)
    for note in prepare(s)[1]:
        render.err.print(f"mxq: {note}", markup=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raise typer.Exit(run_launcher(s, planned.specs, with_schedule, planned.unplanned))


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


def _device_table(records: list[dict[str, Any]]) -> None:
    """The device table, a device that is out saying since when and why (`health`), a GPU
    what NVML last read of it (`nvml`)."""
    from mxq.db.fleet import gpu_memory, out_note
    from mxq.workers.fleet.gpu_health import note

    rows = [{**r, "memory": gpu_memory(r), "nvml": note(r.get("nvml"))} for r in records]
    render.table([{**r, "health": out_note(r["out_reason"], r["out_since"], unplanned=r.get("unplanned"))}
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
    submits_cli.show_job(cast("JobRecord", record), json_)


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
