"""Messages that name the real cause and the fix (issue 29, items 5, 7 and 8): each test calls
the function, the API app or the CLI in this process and fails on the old, misleading text."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from mxq.api import routes
from mxq.api.app import MAX_JSON_DEPTH, app
from mxq.db.migrate import upgrade
from mxq.workers.settings import Settings
from tests.conftest import Stack

JSON = {"Content-Type": "application/json"}


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[TestClient]:
    """The API app on a fresh home without a token (its database migrated: a write asks it who
    the caller is before the body is read)."""
    s = Settings(home=tmp_path, api_token=None)
    upgrade(s.database)
    app.dependency_overrides[routes.settings] = lambda: s
    try:
        with TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)) as client:
            yield client
    finally:
        app.dependency_overrides.clear()


@pytest.mark.parametrize("body,said", [
    (b"[" * 100_000 + b"]" * 100_000,
     f"malformed JSON body: JSON nested deeper than {MAX_JSON_DEPTH} levels"),
    (b'{"kind": "probe", "size": ' + b"9" * 5000 + b"}",
     "malformed JSON body: a number of more than 4300 digits (the most an integer may have)"),
    (b'{"kind": "\xff"}', "malformed JSON body: it is not UTF-8 text"),
], ids=["nested 100000 deep", "5000-digit number", "not UTF-8"])
def test_an_unparsable_body_names_its_real_cause(api: TestClient, body: bytes, said: str) -> None:
    r = api.post("/api/v1/jobs", content=body, headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == said


def test_a_body_within_the_depth_limit_is_parsed(api: TestClient) -> None:
    """The limit the message names is one the parser honours: a body that deep reaches validation."""
    deep = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    r = api.post("/api/v1/jobs", content=deep, headers=JSON)
    assert r.status_code == 422 and "nested deeper" not in r.json()["detail"], r.text


def _two_headed(folder: Path) -> tuple[Path, Path]:
    """An exported net whose symbol has two heads (a Group): its forward returns a list."""
    import mxnet as mx

    data = mx.sym.var("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    heads = mx.sym.Group([mx.sym.FullyConnected(hidden, num_hidden=10, name="a"),
                          mx.sym.FullyConnected(hidden, num_hidden=3, name="b")])
    net = mx.gluon.SymbolBlock(heads, [data])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.initialize()
    net(mx.nd.ones((2, 8)))
    net.export(str(folder / "two"))
    return folder / "two-symbol.json", folder / "two-0000.params"


def test_a_model_with_several_unnamed_outputs_is_refused_at_registration(tmp_path: Path) -> None:
    from mxq.db.migrate import upgrade
    from mxq.tasks.model_store.model_error import ModelError
    from mxq.tasks.model_store.mxnet.versions import add_exported
    from mxq.workers.settings import Settings

    url = f"sqlite:///{tmp_path / 'mxq.db'}"
    upgrade(url)
    symbol, params = _two_headed(tmp_path)
    with pytest.raises(ModelError) as refused:
        add_exported(Settings(home=tmp_path, database_url=url), "two", symbol, params, (8,))
    assert str(refused.value) == (
        "model two has 2 outputs (a_output, b_output) and --outputs names 1; allowed: name each "
        "output in order, --outputs NAME=KIND,NAME=KIND (one output: a kind, or auto)")


def test_a_postgresql_database_that_does_not_exist_is_named_with_how_to_create_it(
        tmp_path: Path) -> None:
    from tests.conftest import run_cli

    proc = run_cli(["jobs"], {"MXQ_HOME": str(tmp_path),
                              "MXQ_DATABASE_URL": "postgresql://127.0.0.1:5432/mxq_no_such_db"})
    if "Connection refused" in proc.stderr:
        pytest.skip("no PostgreSQL on 127.0.0.1:5432")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        'mxq: error: database error: the PostgreSQL database "mxq_no_such_db" does not exist: '
        'create it (`createdb mxq_no_such_db` or CREATE DATABASE "mxq_no_such_db"), then run '
        "`mxq migrate`"]


def test_an_outage_past_the_retry_window_is_one_line_naming_host_and_time() -> None:
    from sqlalchemy.exc import OperationalError

    from mxq.db.retry import DatabaseUnreachable, retrying, transient_db_error, unreachable

    driver = Exception('connection to server at "10.1.2.3", port 5433 failed: Connection refused\n'
                       "\tIs the server running on that host and accepting TCP/IP connections?")
    tries = []

    @retrying(transient_db_error, seconds=0.3, give_up=unreachable)
    def write(url: str) -> None:
        tries.append(url)
        raise OperationalError("UPDATE jobs SET status=%(s)s", {"s": "running"}, driver)

    with pytest.raises(DatabaseUnreachable) as failed:
        write("postgresql+psycopg://mxq:secret@10.1.2.3:5433/mxq")
    assert len(tries) > 1  # retried before giving up
    assert str(failed.value) == ('database unreachable at 10.1.2.3:5433 for 0.3 s: connection to '
                                 'server at "10.1.2.3", port 5433 failed: Connection refused')


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a disk that really fills (needs root; skipped elsewhere)."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_fails_an_npy_job_at_creation_naming_the_disk(
        small_disk: Path, tmp_path: Path) -> None:
    from mxq.db.migrate import upgrade
    from mxq.tasks.inference.outputs import _output_npy, output_path
    from mxq.tasks.job_context import JobFailed
    from mxq.workers.settings import Settings

    url = f"sqlite:///{tmp_path / 'mxq.db'}"
    upgrade(url)
    s = Settings(home=small_disk, database_url=url)
    small = _output_npy(s, 1, 100, 10)  # 4 kB fits
    assert np.load(small.path).shape == (100, 10)
    with pytest.raises(JobFailed) as full:
        _output_npy(s, 2, 100_000, 10)  # 4 MB does not
    path = output_path(s, 2)
    assert str(full.value) == f"no space left on {small_disk} for job-2.npy (4000128 bytes)"
    assert not path.exists()  # nothing half-made left behind


@pytest.mark.parametrize("devices,said", [
    (["cpu:0", "cpu:0"], "invalid train parameters: --device lists a device twice: cpu:0,cpu:0"),
    (["cpu:0", "gpu:0"], "invalid train parameters: --device cpu:0,gpu:0 mixes device kinds: list "
                         "devices of one kind, e.g. gpu:0,gpu:1"),
], ids=["twice", "mixed kinds"])
def test_a_device_list_error_names_the_field_and_value_not_the_whole_request(
        devices: list[str], said: str) -> None:
    from mxq.workers.jobs.jobspecs import ParamsError, validate

    with pytest.raises(ParamsError) as refused:
        validate("train", {"arch": "mlp", "dataset": "d.npz", "name": "m", "device_list": devices},
                 Settings().limits)
    assert str(refused.value) == said


def _finished(url: str, kind: str, status: str, seconds: float, params: dict | None = None) -> int:
    """A job that ran for `seconds` and ended `status`, as a worker leaves it."""
    from datetime import timedelta

    from mxq.db.engine import session_scope
    from mxq.db.jobs import create_job
    from mxq.db.schema import Job, utcnow

    job_id = create_job(url, kind, params or {}, "auto", "pool.cpu")
    with session_scope(url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        end = utcnow()
        job.status, job.attempts, job.device = status, 1, "cpu:0"
        job.started_at, job.finished_at = end - timedelta(seconds=seconds), end
        job.seconds = seconds / 5 if status == "succeeded" else None  # compute time only
    return job_id


@pytest.mark.both_legs
def test_job_duration_counts_every_finished_job_start_to_finish(isolated: Stack) -> None:
    from mxq.api.metrics import render_metrics

    url = isolated.settings.database
    _finished(url, "train", "succeeded", 30.0)
    _finished(url, "train", "failed", 6.0)
    _finished(url, "train", "cancelled", 4.0)
    text = render_metrics(isolated.settings)[0].decode()
    lines = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines()
             if ln.startswith("mxq_job_duration_seconds") and 'kind="train"' in ln}
    assert lines['mxq_job_duration_seconds_count{kind="train"}'] == 3
    assert lines['mxq_job_duration_seconds_sum{kind="train"}'] == pytest.approx(40.0, abs=0.01)


@pytest.mark.both_legs
def test_stats_by_model_leaves_out_requests_refused_at_submit(isolated: Stack) -> None:
    from mxq.db.jobs import create_job
    from mxq.db.reports.history import stats

    url = isolated.settings.database
    _finished(url, "infer", "succeeded", 2.0, {"model": "mlp64"})
    _finished(url, "infer", "failed", 1.0, {"model": "mlp64"})
    create_job(url, "infer", {"model": "nope"}, "auto", "pool.cpu", rejected="unknown model 'nope'")
    rows = stats(url, "model")
    assert [(r["model"], r["jobs"], r["failed"]) for r in rows] == [("mlp64", 2, 1)]
    assert sum(r["jobs"] for r in stats(url, "day")) == 3  # still a submission of that day


def test_ctrl_c_while_waiting_names_the_job_that_goes_on_and_exits_130(
        capsys: pytest.CaptureFixture[str]) -> None:
    from mxq.cli.render import wait_for

    seen: list[int] = []

    def fetch(job_id: int) -> dict:
        if seen:
            raise KeyboardInterrupt  # Ctrl-C during the second poll
        seen.append(job_id)
        return {"id": job_id, "status": "running", "progress": 0.3}

    with pytest.raises(SystemExit) as stopped:
        wait_for(41, fetch, None)  # type: ignore[arg-type]
    assert stopped.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "mxq: stopped waiting; job 41 is still running (mxq cancel 41 to stop it)")


def test_schedule_show_titles_its_table_with_the_schedule(isolated: Stack) -> None:
    from tests.conftest import run_cli

    np.savez(isolated.home / "data" / "d.npz", x=np.zeros((8, 4)), y=np.zeros(8))
    added = run_cli(["schedule", "add", "nightly", "--cron", "0 3 * * *", "--arch", "mlp",
                     "--dataset", "d.npz", "--model", "m"], isolated.env)
    assert added.returncode == 0, added.stderr
    shown = run_cli(["schedule", "show", "nightly"], isolated.env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.lstrip().startswith("schedule nightly"), shown.stdout
    assert "job nightly" not in shown.stdout


def test_the_client_without_a_url_finds_the_stack_as_the_cli_does(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from mxq.client.api import Client, stack_url
    from mxq.workers.stack_record import record_stack

    home = tmp_path / "home"
    for key in ("MXQ_API_HOST", "MXQ_API_PORT", "MXQ_API_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MXQ_HOME", str(home))
    assert stack_url() == "http://127.0.0.1:8470"  # no stack recorded: mxq's defaults
    record_stack(Settings(home=home, api_host="0.0.0.0", api_port=9123))  # what `mxq up` writes
    assert stack_url() == "http://127.0.0.1:9123"  # a wildcard bind is reached on loopback
    monkeypatch.setenv("MXQ_API_PORT", "9555")
    assert Client().base_url == "http://127.0.0.1:9555/api/v1"  # the shell's setting wins
    assert stack_url({"MXQ_HOME": str(home), "MXQ_API_HOST": "::1"}) == "http://[::1]:9123"
    assert Client("http://example:1").base_url == "http://example:1/api/v1"


VALID_CRONS = ["0 3 * * *", "*/5 * * * *", "0 9-17 * * mon-fri", "15,45 */2 1-15 JAN,jul sun",
               "0 0 L * *", "0 0 * * mon#2", "30 4 15W * *", "0 0 ? * ?", "59 23 31 12 7",
               "0 0 1-31/2 1-12/3 0-6/2", "5/10 * * * *"]


def test_the_schedule_cron_declares_a_pattern_every_valid_cron_matches() -> None:
    import re

    from mxq.workers.schedules.cron import check

    declared = app.openapi()["components"]["schemas"]["ScheduleRequest"]["properties"]["cron"]
    pattern = re.compile(declared["pattern"])
    for cron in VALID_CRONS:
        check(cron, "UTC")
        assert pattern.fullmatch(cron), cron
    for wrong in ("every day", "0 0 3 * * *", "61 * * * *", "0 25 * * *"):
        assert not pattern.fullmatch(wrong), wrong


def test_mxq_version_prints_the_installed_package_version() -> None:
    from importlib.metadata import version

    from tests.conftest import run_cli

    proc = run_cli(["--version"], {})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"mxq {version('mxq')}"


def test_a_missing_relative_input_shows_where_it_was_looked_for(tmp_path: Path) -> None:
    from mxq.workers.paths import PathError, inside_root

    with pytest.raises(PathError) as missing:
        inside_root("./x.csv", tmp_path)
    assert str(missing.value) == (f"input ./x.csv does not exist (looked for {tmp_path / 'x.csv'}; "
                                  f"a relative path counts from the data root {tmp_path}, MXQ_DATA_ROOT)")
    with pytest.raises(PathError) as absolute:
        inside_root(tmp_path / "y.csv", tmp_path)
    assert str(absolute.value) == f"input {tmp_path / 'y.csv'} does not exist"


def test_the_api_names_a_device_list_problem_without_the_whole_body(api: TestClient) -> None:
    r = api.post("/api/v1/jobs", json={"kind": "train", "arch": "mlp", "dataset": "d", "name": "m",
                                       "device_list": ["cpu:0", "cpu:0"]})
    assert r.status_code == 422
    assert r.json()["detail"] == "invalid request: --device lists a device twice: cpu:0,cpu:0"
    r = api.post("/api/v1/jobs", json={"kind": "train", "arch": "mlp", "name": "m"})
    assert r.json()["detail"] == "invalid request: train.dataset: Field required"
