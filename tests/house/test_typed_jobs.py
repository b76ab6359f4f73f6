"""A job is typed from its submit to its task body (issue 46): `jobspecs.validate` returns the
kind's pydantic model, submit pins and routes that model, the runner hands a body its parameters
typed (`JobContext.params(InferParams)`), and a job becomes JSON only where it is stored
(`jobspecs.stored`) or a training child writes its report.

Each rule is an AST walk over the job path (workers/jobs/, the runner and the task bodies), with
its allowed places; a self-check shows each walk finds what it forbids. The model store below the
bodies keeps its registry records' own types.
"""

from __future__ import annotations

import ast

import pytest
from pydantic import BaseModel

from mxq.workers.jobs.jobspecs import InferRequest, ProbeParams, TrainOptions, TrainRequest
from tests.conftest import ROOT
from tests.house.test_settings_edges import _calls_of

# Submit, the runner, and the task bodies with what they call per job (not the model store).
JOB_PATH = ("workers/jobs", "tasks/runner.py", "tasks/job_context.py", "tasks/inference", "tasks/training",
            "tasks/runtimes", "tasks/model_store/register.py")
# Where a typed job becomes JSON: the rows submit writes and chunks fan out to, and a training
# child's report file (json.dumps, so that a NaN loss stays NaN).
SERIALISED_AT = {"workers/jobs/kinds/params.py": {"stored"}, "tasks/training/child_report.py": {"write"}}
# Who reads a job's parameters as SQL stored them: the runner (which types them for the body) and
# a dynamic batch, which compares queued jobs' stored parameters before it opens their inputs.
READS_STORED = {"tasks/job_context.py", "tasks/inference/batching.py"}


def _job_path() -> dict[str, ast.AST]:
    paths = [p for where in JOB_PATH for p in
             ([ROOT / where] if where.endswith(".py") else sorted((ROOT / where).rglob("*.py")))]
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text()) for path in paths}


def _untyped_dicts(tree: ast.AST) -> list[int]:
    """The lines of `dict[str, Any]` annotations and subscripts."""
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "dict"
            and isinstance(n.slice, ast.Tuple) and len(n.slice.elts) == 2
            and isinstance(n.slice.elts[1], ast.Name) and n.slice.elts[1].id == "Any"]


def _reads_stored(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "stored" and isinstance(n.ctx, ast.Load)
               for n in ast.walk(tree))


def test_no_untyped_dict_on_the_job_path() -> None:
    found = {path: lines for path, tree in _job_path().items()
             if (lines := _untyped_dicts(tree))}
    assert not found, f"dict[str, Any] on the job path (use the kind's model, or dict[str, object] " \
                      f"for free-form JSON): {found}"


def test_jobs_become_json_only_where_they_are_stored() -> None:
    wrong = {path: sorted(callers - SERIALISED_AT.get(path, set()))
             for path, tree in _job_path().items()
             if (callers := _calls_of(tree, "model_dump")) - SERIALISED_AT.get(path, set())}
    assert not wrong, f"model_dump() on the job path (pass the typed model on): {wrong}"


def test_bodies_read_their_parameters_typed() -> None:
    readers = {path for path, tree in _job_path().items() if _reads_stored(tree)}
    assert readers <= READS_STORED, \
        f"stored parameters read untyped (use job.params(Spec)): {sorted(readers - READS_STORED)}"


def test_the_walks_find_what_they_forbid() -> None:
    body = ast.parse("from typing import Any\n\ndef infer(job, p: dict[str, Any]) -> dict[str, int]:\n"
                     "    n = job.stored['size']\n    return p.model_dump()\n")
    assert _untyped_dicts(body) == [3]
    assert _calls_of(body, "model_dump") == {"infer"}
    assert _reads_stored(body)
    assert not _reads_stored(ast.parse("def f(job):\n    job.stored = {}\n"))
    assert {"workers/jobs/submit.py", "tasks/runner.py", "tasks/inference/infer.py",
            "tasks/training/train_task.py", "tasks/model_store/register.py"} <= set(_job_path())


# Request fields a CLI command takes under another form: the version inside NAME:VERSION, the
# device list inside --device, the schedule's model name inside its own NAME argument.
CLI_FORMS = {"model_version": "MODEL as NAME:VERSION", "device_list": "--device gpu:0,gpu:1",
             "from_version": "--from NAME:VERSION"}


@pytest.mark.parametrize(("command", "spec"), [
    (("infer",), InferRequest), (("train",), TrainRequest), (("schedule", "add"), TrainOptions),
    (("probe",), ProbeParams)])
def test_the_cli_takes_every_field_of_the_request_the_api_validates(
        command: tuple[str, ...], spec: type[BaseModel]) -> None:
    """The CLI sends the same request the API's schema is made of (`jobspecs`): a field added to
    a request and not to its command is found here, not by a user."""
    from typer.main import get_command

    from mxq.cli.main import app

    cmd = get_command(app)
    for word in command:
        cmd = cmd.commands[word]  # type: ignore[attr-defined]  # a group's
    options = {p.name for p in cmd.params}
    missing = set(spec.model_fields) - options - set(CLI_FORMS)
    assert not missing, f"`mxq {' '.join(command)}` lacks options for {sorted(missing)}"


@pytest.mark.parametrize("command", ["infer", "train", "probe"])
def test_every_submit_command_takes_every_routing_field_of_the_api(command: str) -> None:
    """Where a job runs, its turn, its team and the jobs it waits for (`Routing`: `--after`…)
    are the API's for every kind; each submit command takes them too."""
    from typer.main import get_command

    from mxq.api.schemas import Routing
    from mxq.cli.main import app

    options = {p.name for p in get_command(app).commands[command].params}  # type: ignore[attr-defined]
    missing = set(Routing.model_fields) - options
    assert not missing, f"`mxq {command}` lacks options for {sorted(missing)}"
