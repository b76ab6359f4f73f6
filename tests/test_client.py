"""`mxq.client` against a real `mxq api` on a real stack, and the README's client example run as
written, on both backends."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np
import pytest

from mxq.client import Client
from mxq.db import predictions
from mxq.errors import JobRejected, NotFound, Unauthorized, UserError
from tests.api_server import Api, start_api
from tests.conftest import ROOT, Stack

pytestmark = pytest.mark.both_legs

TOKEN = "client-token-4a9b8c7d"


@pytest.fixture(scope="module")
def api(workers: Stack, mlp: dict) -> Iterator[Api]:
    yield from start_api(workers, TOKEN, "api-client")


def test_infer_wait_and_read_the_predictions(workers: Stack, api: Api) -> None:
    rows = np.random.default_rng(3).normal(size=(2500, 64)).astype(np.float32)
    np.save(workers.home / "data" / "client.npy", rows)
    with Client(api.url, token=TOKEN) as client:
        job = client.infer("mlp64", "client.npy", device="cpu:1", top_k=2).wait(timeout=300)
        assert job.status == "succeeded" and len(job) == 2500 and job.record["device"] == "cpu:1"
        stored = predictions.read(workers.settings.database, job.id)
        got = job.predictions("numpy")
        assert got["index"].tolist() == [r["index"] for r in stored] == list(range(2500))
        assert got["predicted_class"].tolist() == [r["predicted_class"] for r in stored]
        table = job.predictions("arrow")
        assert table.num_rows == 2500 and table.column_names == ["index", "predicted_class", "score",
                                                                 "top_k"]
        assert job.id in [j.id for j in client.jobs(status="succeeded", since="1h", limit=1000)]


def test_errors_are_mxqs_own(workers: Stack, api: Api) -> None:
    with Client(api.url, token=TOKEN) as client:
        with pytest.raises(NotFound, match="no job 987654"):
            client.job(987654)
        with pytest.raises(JobRejected, match="unknown model 'nosuch'") as rejected:
            client.infer("nosuch", "client.npy")
        assert client.job(rejected.value.job_id).status == "failed"  # recorded, as the CLI does
        with pytest.raises(UserError, match="batch_size=0"):
            client.infer("mlp64", "client.npy", batch_size=0)
        queued = client.probe(device="cpu:7", allow_offline=True)
        assert client.cancel(queued.id).status == "cancelled"
    with Client(api.url, token="not-the-token-at-all") as wrong, pytest.raises(Unauthorized):
        wrong.probe(device="cpu:0")


def test_the_readme_example_runs_as_written(workers: Stack, api: Api,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    section = (ROOT / "README.md").read_text().split("### Python client", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    if "digits-demo" not in {m["name"] for m in workers.mxq_json("models")}:
        assert workers.mxq("models", "add", "digits-demo", "--arch", "lenet", "--input-shape", "1,8,8",
                           "--scale", "1/16").returncode == 0
    folder = workers.home / "data" / "mxq-demo"
    folder.mkdir(exist_ok=True)
    np.save(folder / "digits-raw-x20.npy", np.zeros((300, 1, 8, 8), np.float32))
    env = {"MXQ_URL": api.url, "MXQ_API_TOKEN": TOKEN}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        exec(compile(example, "README.md", "exec"), {})  # noqa: S102  # the README's own code
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out = capsys.readouterr().out
    assert "succeeded 300 samples at " in out and "[" in out, out
