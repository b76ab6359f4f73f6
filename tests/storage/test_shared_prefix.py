"""Two stacks against one bucket and prefix (issue 44, "Done when"): two homes and databases
allowed the same prefix, each running jobs 1, 2, 3, … of every output kind kept in a bucket
(`.npy`, Parquet, and chunked, both), all with `--output-to s3://BUCKET/in/shared-prefix`: every
job's object holds its own stack's predictions of its own input, none the other's."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text

from mxq.db.engine import get_engine
from mxq.db.stack import stack_id
from tests.conftest import Stack, _stack, launch, stop
from tests.support.s3 import BUCKET, S3Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PREFIX = "in/shared-prefix"
SAMPLES = 3_000
KINDS = [("npy", []), ("parquet", []), ("npy", ["--chunk-size", "1000"]),
         ("parquet", ["--chunk-size", "1000"])]


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def _own_stack_id(stack: Stack) -> str:
    """A stack id of its own: the tests' databases are copies of one template, and so share
    one, where two stacks `mxq migrate` made never do."""
    new = uuid.uuid4().hex[:16]
    with get_engine(stack.settings.database).begin() as conn:
        conn.execute(text("UPDATE stack SET id = :id"), {"id": new})
    assert stack_id(stack.settings.database) == new
    return new


@pytest.fixture
def two_stacks(tmp_path: Path) -> Iterator[list[Stack]]:
    gens = [_stack("embedded", tmp_path / name, 0) for name in ("a", "b")]
    stacks = [next(gen) for gen in gens]
    try:
        for s in stacks:
            _own_stack_id(s)
            s.launcher = launch(s)
        yield stacks
    finally:
        for s in stacks:
            if s.launcher is not None and s.launcher.poll() is None:
                stop(s.launcher)
        for gen in gens:
            next(gen, None)


def _submit(stack: Stack, url: str, *args: str) -> int:
    proc = stack.mxq("infer", "mlp64", url, "--batch-size", "250", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return int(json.loads(proc.stdout)["id"])


def _object(s3: S3Server, url: str) -> io.BytesIO:
    key = url.removeprefix(f"s3://{BUCKET}/")
    return io.BytesIO(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _check(s3: S3Server, record: dict[str, Any], output: str, expected: np.ndarray) -> None:
    assert record["status"] == "succeeded", record["error"]
    body = _object(s3, record["output"])
    if output == "npy":
        np.testing.assert_allclose(np.load(body), expected, rtol=1e-5, atol=1e-7)
        return
    table = pq.read_table(body)
    assert table.column("index").to_pylist() == list(range(SAMPLES))
    assert np.array_equal(table.column("predicted_class").to_numpy(), expected.argmax(axis=1))
    np.testing.assert_allclose(table.column("score").to_numpy(), expected.max(axis=1), rtol=1e-5)


def test_two_stacks_sharing_a_prefix_keep_every_jobs_own_rows(two_stacks: list[Stack]) -> None:
    s3 = S3Server.shared()
    out = f"s3://{BUCKET}/{PREFIX}"
    urls, ids = [], []
    for n, stack in enumerate(two_stacks):
        add = stack.mxq("models", "add", "mlp64", "--arch", "mlp", "--input-shape", "64",
                        "--classes", "10")
        assert add.returncode == 0, add.stderr
        x = np.random.default_rng(100 + n).normal(size=(SAMPLES, 64)).astype(np.float32)
        urls.append(s3.put(f"in/shared-input-{n}.npy", _npy(x)))
        ids.append([_submit(stack, urls[n], "--output", output, "--output-to", out, *extra)
                    for output, extra in KINDS])
    assert ids[0][:3] == ids[1][:3] == [1, 2, 3]  # the same numbers in both stacks (a chunked
    # job's chunks take ids when it runs: the fourth may be another number)
    expected = []
    for n, stack in enumerate(two_stacks):  # each stack's own predictions, as a local file
        ref = stack.wait(_submit(stack, urls[n], "--output", "npy"), timeout=300)
        assert ref["status"] == "succeeded", ref["error"]
        expected.append(np.load(str(ref["output"])))
    assert not np.allclose(expected[0], expected[1])  # the rows of one are not the other's
    finals = []
    for n, stack in enumerate(two_stacks):
        for job_id, (output, _) in zip(ids[n], KINDS, strict=True):
            record = dict(stack.wait(job_id, timeout=300))
            assert record["output"] == f"{out}/{stack_id(stack.settings.database)}/job-{job_id}.{output}"
            _check(s3, record, output, expected[n])
            finals.append(record["output"].removeprefix(f"s3://{BUCKET}/"))
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/").get("Contents", [])
    assert sorted(o["Key"] for o in listed) == sorted(finals)  # one object per job, no part left
    assert len(set(finals)) == 2 * len(KINDS)
    s3.client().delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in finals]})
