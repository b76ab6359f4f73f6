"""Settings are read at the edges and passed in (issue 46): a job body gets its worker's settings
in its frame (`JobContext.settings`), never from the process-wide `get_settings()`, and only the
modules that start processes or are themselves a process's start read `os.environ`; workers/
reads the process's settings only where its processes start (a publisher's included: it takes
the settings it publishes with).

Each rule is an AST walk over the source, with the list of its allowed places; a self-check
shows each walk finds what it forbids.
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

# Where tasks/ may read the process's settings: a worker's or a training child's start, and
# hooks of the worker process itself (its heartbeat's idle beat), never a job body.
SETTINGS_EDGES = {
    "tasks/runner.py": {"this_worker",  # a device worker's frame, made per delivery
                        "_probe_first_when_idle"},  # the heartbeat's idle beat
    "tasks/training/train_child.py": {"<module>"},  # the child's start (`__main__`)
    "tasks/runtimes/onnx_worker.py": {"_refuse_unusable_gpu"},  # Celery's worker_init
    "tasks/runtimes/mx_context.py": {"_refuse_unusable_device"},  # Celery's worker_init
    "tasks/inference/device_memory.py": {"give_back_while_leased"},  # the heartbeat's idle beat
}
# The modules that read os.environ: the settings themselves, the client (a user's script), and
# those that start processes with the environment (the launcher, a training's leader and its
# nodes) or are the start of one (the training child: its kvstore role); ONNX Runtime reads the
# thread count the launcher pinned the worker to; OpenLineage's export reads the configuration
# of OpenLineage's own client (OPENLINEAGE_*), as that client does.
ENVIRON_EDGES = {"workers/settings/broker.py", "workers/launch/launcher.py", "client/api.py",
                 "workers/openlineage/sender.py",
                 "tasks/training/train_task.py", "tasks/training/dist.py",
                 "tasks/training/train_child.py", "tasks/runtimes/onnx_runtime.py"}
PACKAGE = ("core", "db", "workers", "tasks", "api", "cli", "client")


def _calls_of(tree: ast.AST, name: str) -> set[str]:
    """The functions (by name; `<module>` at module level) that call `name(...)`."""
    found: set[str] = set()

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                walk(child, child.name)
                continue
            if isinstance(child, ast.Call) and (
                    (isinstance(child.func, ast.Name) and child.func.id == name)
                    or (isinstance(child.func, ast.Attribute) and child.func.attr == name)):
                found.add(where)
            walk(child, where)

    walk(tree, "<module>")
    return found


def _reads_environ(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os"
               and n.attr in ("environ", "getenv") for n in ast.walk(tree))


def _sources(*folders: str) -> dict[str, ast.AST]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text())
            for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))}


def test_no_job_body_reads_the_process_settings() -> None:
    wrong = {path: sorted(callers - SETTINGS_EDGES.get(path, set()))
             for path, tree in _sources("tasks").items()
             if (callers := _calls_of(tree, "get_settings")) - SETTINGS_EDGES.get(path, set())}
    assert not wrong, f"get_settings() called below the edges (pass JobContext.settings): {wrong}"


# Where workers/ may read the process's settings: the starts of its processes (the Celery app's
# config, a device worker's heartbeat at worker_ready, the control worker's tasks), and a job
# request validated without limits given (the API's schema, in the API process: submit validates
# again with the settings passed in).
WORKERS_EDGES = {
    "workers/broker/app.py": {"<module>"},  # the process-wide app's config, read when first used
    "workers/fleet/heartbeat.py": {"start", "refuse_unclear"},  # worker_ready, worker_init
    "workers/control.py": {"tick_task", "reconcile_task", "retention_task", "fire_task",
                           "hooks_task", "openlineage_task"},  # its tasks
    "workers/jobs/kinds/params.py": {"at_most"},  # no limits in the context
    "workers/jobs/kinds/probe.py": {"_within_budget"},
}


def test_workers_read_the_process_settings_only_at_their_starts() -> None:
    wrong = {path: sorted(callers - WORKERS_EDGES.get(path, set()))
             for path, tree in _sources("workers").items() if not path.startswith("workers/settings/")
             if (callers := _calls_of(tree, "get_settings")) - WORKERS_EDGES.get(path, set())}
    assert not wrong, f"get_settings() called below the edges (pass the settings in): {wrong}"


def test_a_publisher_times_out_as_its_settings_say() -> None:
    """A submit's publish gives up after its own settings' MXQ_BROKER_TIMEOUT_SECONDS, not the
    process's (the publishing app read the process's settings before)."""
    from mxq.workers.broker.app import app_for
    from mxq.workers.settings import Settings

    quick = Settings(broker_url="redis://127.0.0.1:1/0", broker_timeout_seconds=0.5)
    patient = quick.model_copy(update={"broker_timeout_seconds": 7.0})
    assert app_for(quick).conf.broker_transport_options["socket_timeout"] == 0.5
    assert app_for(patient).conf.broker_transport_options["socket_timeout"] == 7.0
    assert app_for(quick).conf.broker_url.endswith("127.0.0.1:1/0")


def test_only_the_edges_read_the_environment() -> None:
    readers = {path for path, tree in _sources(*PACKAGE).items() if _reads_environ(tree)}
    assert readers <= ENVIRON_EDGES, f"os.environ read outside the edges: {sorted(readers - ENVIRON_EDGES)}"


def test_the_walks_find_what_they_forbid() -> None:
    body = ast.parse("from mxq.workers.settings import get_settings\nimport os\n\n"
                     "def infer(job):\n    return helper(get_settings().max_batch_size)\n\n"
                     "def edge():\n    return os.environ.get('X')\n")
    assert _calls_of(body, "get_settings") == {"infer"}
    assert _reads_environ(body)
    assert not _reads_environ(ast.parse("import os\nos.sched_getaffinity(0)\n"))
