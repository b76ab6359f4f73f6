"""A job's OpenLineage run events, built from its row (`mxq.db.lineage.openlineage.RunFacts`).

The run is the job (its runId a UUID made from the stack and the job id, the same on every
send); the job is `infer.MODEL` or `train.MODEL` in OPENLINEAGE_NAMESPACE (default `mxq`); a
schedule's fire is the parent run. Inputs name the file, folder or bucket prefix read, with the
input identity mxq recorded as the dataset's version; outputs name the prediction set (its SQL
rows, or its Parquet or `.npy` location) with a schema facet, or the model version a training
registered. The model version and the engine that served it are run facets.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import attr
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    DatasetFacet,
    OutputDatasetFacet,
    RunFacet,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    schema_dataset,
)

from mxq.db.lineage.openlineage import RunFacts
from mxq.status import JobStatus

PRODUCER = "https://github.com/mxq/mxq"  # who made the events, as the specification asks
MODEL_FACET_SCHEMA = f"{PRODUCER}/blob/main/docs/openlineage.md#the-mxq_model-run-facet"
ENDS = {JobStatus.SUCCEEDED: RunState.COMPLETE, JobStatus.FAILED: RunState.FAIL,
        JobStatus.CANCELLED: RunState.ABORT}
# The predictions table's columns, as a schema facet gives them.
SQL_ROWS = (("job_id", "INTEGER"), ("first_index", "BIGINT"), ("samples", "INTEGER"),
            ("classes", "BLOB int32le[]"), ("scores", "BLOB float32le[]"), ("top_k", "JSON list"))


@attr.define
class MxqModelRunFacet(RunFacet):
    """mxq's own run facet: the model version a job served or registered, and for inference the
    variant (its precision) and the engine that served it."""

    name: str | None = attr.field(default=None)
    version: int | None = attr.field(default=None)
    engine: str | None = attr.field(default=None)
    precision: str | None = attr.field(default=None)
    devices: list[str] = attr.field(factory=list)
    samples: int | None = attr.field(default=None)
    samples_per_sec: float | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return MODEL_FACET_SCHEMA


def run_id(stack: str, job_id: int) -> str:
    """The job's run id: the same for its START and its end, unique across stacks."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"mxq://{stack}/jobs/{job_id}"))


@dataclass(frozen=True)
class Source:
    """Where the events come from: the stack (its id makes the run ids), its database (where SQL
    rows are), mxq's version, and the jobs' namespace (OPENLINEAGE_NAMESPACE, default `mxq`)."""

    stack: str
    database: str
    version: str
    namespace: str = "mxq"


def events(facts: RunFacts, source: Source) -> list[RunEvent]:
    """The events due for the job: START, its end, or both in that order."""
    out = []
    if facts.start_due:
        out.append(_event(facts, source, RunState.START, facts.started_at))
    if facts.end_due:
        out.append(_event(facts, source, ENDS[JobStatus(facts.status)], facts.finished_at))
    return out


def _event(facts: RunFacts, source: Source, state: RunState, at: datetime | None) -> RunEvent:
    model = str(facts.params.get("model") or facts.params.get("name") or "unnamed")
    job = Job(namespace=source.namespace, name=f"{facts.kind}.{model}", facets={
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="MXQ",
            jobType="INFERENCE" if facts.kind == "infer" else "TRAINING", producer=PRODUCER)})
    ended = state in (RunState.COMPLETE, RunState.FAIL, RunState.ABORT)
    run = Run(runId=run_id(source.stack, facts.id), facets=_run_facets(facts, source, model, ended))
    return RunEvent(eventType=state, eventTime=(at or datetime.now(UTC)).isoformat(), run=run,
                    job=job, inputs=_inputs(facts),
                    outputs=_outputs(facts, source.database) if ended else [], producer=PRODUCER)


def _run_facets(facts: RunFacts, source: Source, model: str, ended: bool) -> dict[str, RunFacet]:
    result, params = facts.result, facts.params
    facets: dict[str, RunFacet] = {
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=source.version, name="mxq", producer=PRODUCER),
        "mxq_model": MxqModelRunFacet(
            name=model, version=_int(result.get("model_version") or params.get("model_version")),
            engine=result.get("engine"), precision=result.get("precision"), devices=facts.devices,
            samples=facts.samples if ended else None,
            samples_per_sec=facts.samples_per_sec if ended else None,
            producer=PRODUCER),
    }
    if facts.fire_id is not None:
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=str(uuid.uuid5(uuid.NAMESPACE_URL,
                                                    f"mxq://{source.stack}/fires/{facts.fire_id}"))),
            job=parent_run.Job(namespace=source.namespace,
                               name=f"schedule.{facts.schedule or 'removed'}"),
            producer=PRODUCER)
    if facts.status == JobStatus.FAILED and ended and facts.error:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=facts.error, programmingLanguage="python", producer=PRODUCER)
    return facets


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def dataset_name(location: str) -> tuple[str, str]:
    """(namespace, name) of a file, folder or object by OpenLineage's naming: `file` and the
    absolute path, `s3://BUCKET` and the key or prefix."""
    if location.startswith("s3://"):
        parts = urlsplit(location)
        return f"s3://{parts.netloc}", parts.path.lstrip("/") or "/"
    return "file", str(Path(location).absolute())


def _inputs(facts: RunFacts) -> list[InputDataset]:
    source = facts.params.get("input") if facts.kind == "infer" else facts.params.get("dataset")
    if not isinstance(source, str) or not source:
        return []
    if facts.kind == "train" and "/" not in source and not source.endswith((".npz", ".npy")):
        ns, name = "mxq", f"datasets/{source}"  # a built-in dataset (digits)
    else:
        ns, name = dataset_name(source)
    identity = facts.params.get("input_identity")
    facets: dict[str, DatasetFacet] = {}
    if isinstance(identity, str) and identity:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=identity, producer=PRODUCER)
    return [InputDataset(namespace=ns, name=name, facets=facets)]


def _outputs(facts: RunFacts, database: str) -> list[OutputDataset]:
    if facts.status != JobStatus.SUCCEEDED:
        return []
    if facts.kind == "train":
        version = _int(facts.result.get("model_version"))
        name = str(facts.params.get("name") or "unnamed")
        facets: dict[str, DatasetFacet] = {} if version is None else {
            "version": dataset_version_dataset.DatasetVersionDatasetFacet(
                datasetVersion=str(version), producer=PRODUCER)}
        return [OutputDataset(namespace="mxq", name=f"models/{name}", facets=facets)]
    output = facts.result.get("output")
    stats: dict[str, OutputDatasetFacet] = {
        "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
        rowCount=facts.samples, producer=PRODUCER)}
    fields: tuple[tuple[str, str], ...] = SQL_ROWS
    if output == "db" or not isinstance(output, str):
        ns, name = sql_table(database, "predictions")
    else:
        ns, name = dataset_name(output)
        fields = _file_fields(output)
    schema = schema_dataset.SchemaDatasetFacet(fields=[
        schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in fields], producer=PRODUCER)
    return [OutputDataset(namespace=ns, name=name, facets={"schema": schema}, outputFacets=stats)]


def sql_table(database: str, table: str) -> tuple[str, str]:
    """(namespace, name) of a table by OpenLineage's naming: `postgres://HOST:PORT` and
    `DATABASE.public.TABLE`; for SQLite, `sqlite` and the file's path and the table."""
    parts = urlsplit(database)
    if parts.scheme.startswith("postgresql"):
        return f"postgres://{parts.hostname}:{parts.port or 5432}", f"{parts.path.lstrip('/')}.public.{table}"
    return "sqlite", f"{parts.path.lstrip('/') or database}.{table}"


def _file_fields(output: str) -> tuple[tuple[str, str], ...]:
    """A local output's columns as its file says them: Parquet's schema, a `.npy`'s dtype and
    shape; none for an object in a bucket (never fetched to describe it)."""
    path = Path(output)
    if output.startswith("s3://") or not path.is_file():
        return ()
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # only here: the events of other outputs need no Arrow
        return tuple((f.name, str(f.type)) for f in pq.read_schema(path))
    if path.suffix == ".npy":
        import numpy as np
        array = np.load(path, mmap_mode="r")
        return (("values", f"{array.dtype}{list(array.shape)}"),)
    return ()
