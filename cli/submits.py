"""`mxq probe`, `mxq infer`, `mxq train`: each command's options are its kind's request (the
fields of the model the API validates: tests/house/test_typed_jobs.py keeps them one list), queued
by one submit path and reported alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from mxq.cli import models as models_cli
from mxq.cli import render
from mxq.cli.errors import EXIT_JOB_FAILED
from mxq.cli.options import (
    AfterOpt,
    FromOpt,
    JsonOpt,
    KeyOpt,
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
from mxq.cli.settings import get_settings
from mxq.priorities import Priority
from mxq.status import UNSUCCESSFUL

if TYPE_CHECKING:
    from mxq.db.records import JobRecord
    from mxq.workers.jobs.jobspecs import JobRequest, Rejected


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
    from mxq.workers.jobs.jobspecs import ProbeParams, requested

    request = requested(ProbeParams, size=size, batch=batch, repeat=repeat,
                        time_limit=parse_time_limit(time_limit))
    _submit_and_report(request, device, allow_offline, wait, json_, idempotency_key,
                       (priority, preemptible), team, parse_after(after))


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
    from mxq.workers.jobs.jobspecs import InferRequest, requested

    request = requested(
        InferRequest, model=model, input=input,
        batch_size=int(batch_size) if batch_size.lstrip("-").isdigit() else batch_size,
        output=output, engine=engine, precision=precision, min_agreement=min_agreement,
        top_k=top_k, threshold=threshold, chunk_size=chunk_size, key=key, reject_nan=reject_nan,
        columns=None if columns is None else [c.strip() for c in columns.split(",")],
        output_to=output_to, time_limit=parse_time_limit(time_limit))
    _submit_and_report(request, device, allow_offline, wait, json_, idempotency_key,
                       (priority, preemptible), team, parse_after(after))


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
    from mxq.workers.jobs.jobspecs import TrainRequest, requested

    request = requested(
        TrainRequest, arch=source, dataset=data, name=name or "", devices=devices, nodes=nodes,
        **from_fields(from_model), reinit=reinit, **preprocess_fields(scale, mean, std, layout),
        device_list=device_list, epochs=epochs, batch_size=batch_size, lr=lr, optimizer=optimizer,
        momentum=momentum, weight_decay=weight_decay, lr_schedule=lr_schedule, lr_step=lr_step,
        lr_factor=lr_factor, dtype=dtype, val_fraction=val_fraction, seed=seed,
        label_column=label_column,
        input_shape=list(models_cli.parse_shape(input_shape) or ()) if input_shape else None,
        calibration=calibration, min_agreement=min_agreement, variants=parse_variants(variants),
        time_limit=parse_time_limit(time_limit))
    _submit_and_report(request, route, allow_offline, wait, json_, idempotency_key,
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


def _submit_and_report(request: JobRequest | Rejected, device: str, allow_offline: bool,
                       wait: bool, json_: bool, idempotency_key: str | None,
                       turn: tuple[str, bool | None], team: str | None = None,
                       after: list[int] | None = None) -> None:
    from mxq.db.reports.history import require_job
    from mxq.workers.jobs.jobspecs import Rejected
    from mxq.workers.jobs.submit import submit_request

    s = get_settings()
    kind = request.kind if isinstance(request, Rejected) else request.job_kind
    done = submit_request(s, kind, request, device, allow_offline, idempotency_key,
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
    show_job(require_job(s.database, job_id, with_metrics=True), json_)


def show_job(record: JobRecord, json_: bool) -> None:
    if json_:
        render.print_json(record)
    else:
        render.job_detail(record)
    if record["status"] in UNSUCCESSFUL:
        if not json_:
            render.err.print(f"mxq: job {record['id']} {record['status']}: {record['error']}",
                             markup=False)
        raise typer.Exit(EXIT_JOB_FAILED)
