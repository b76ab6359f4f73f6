"""Outputs in a bucket are their own job's and their own stack's (issue 44, item 1): an object's
key carries the stack's id, a job lists and removes only the parts directly under its own parts
prefix, an output prefix inside another job's output or parts is refused at submit, and a write
that would replace an object the job did not create is refused (If-None-Match: *, the job named
in the object's metadata): the job fails naming it, while its own earlier write is accepted."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from sqlalchemy import text

from mxq.db.engine import get_engine
from mxq.db.stack import stack_id
from mxq.errors import JobRejected
from mxq.objects import ObjectURL, ObjectURLError, check_output_prefix, job_output, parse
from mxq.tasks.inference.part_stores import BucketParts
from mxq.workers.jobs.submit import submit
from mxq.workers.storage import client as s3c
from mxq.workers.storage.client import WRITER, ObjectTaken
from tests.conftest import Stack
from tests.support.inference import infer_and_wait
from tests.support.s3 import BUCKET, S3Server


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def test_two_stacks_never_name_one_object() -> None:
    first, second = (job_output("s3://team-data/out/", stack, 2) for stack in ("a1b2", "c3d4"))
    assert str(first) == "s3://team-data/out/a1b2/job-2.parquet"
    assert first != second and str(second).endswith("/c3d4/job-2.parquet")


@pytest.mark.parametrize("prefix", ["s3://bkt/out/q/job-48.parquet.parts", "s3://bkt/out/x/job-7.npy",
                                    "s3://bkt/out/abc/job-3.parquet/deeper", "s3://bkt/a/my.parts/z"])
def test_a_prefix_inside_another_jobs_output_is_refused(prefix: str) -> None:
    with pytest.raises(ObjectURLError, match="another job's output or parts"):
        check_output_prefix(parse(prefix, "output_to"))
    assert check_output_prefix(parse("s3://bkt/out/q/jobs-48", "output_to")).key == "out/q/jobs-48"


def test_a_submit_into_another_jobs_parts_is_refused(workers: Stack, mlp: dict) -> None:
    np_input = S3Server.shared().put("in/ownership.npy", _npy(np.ones((4, 64), np.float32)))
    with pytest.raises(JobRejected, match="lies inside 'job-48.parquet.parts'"):
        submit(workers.settings, "infer", {"model": "mlp64", "input": np_input, "output": "parquet",
                                         "output_to": f"s3://{BUCKET}/in/q/job-48.parquet.parts"},
               "cpu:0", allow_offline=True)


def test_a_job_lists_and_removes_only_the_parts_directly_under_its_own(stack: Stack,
                                                                       tmp_path: Path) -> None:
    """Job 47's objects written under job 48's parts prefix (deeper, as a prefix inside it
    once could) are neither merged nor deleted by job 48."""
    s3 = S3Server.shared()
    final = ObjectURL(BUCKET, f"in/own/{stack_id(stack.settings.database)}/job-48.parquet")
    parts = BucketParts(stack.settings, final, tmp_path)
    table = pa.table({"index": pa.array([0, 1], pa.int64()), "predicted_class": [3, 4],
                      "score": pa.array([0.5, 0.25], pa.float32())})
    own = parts.write_part([table], "j48a1")
    assert own is not None
    foreign = f"{final.key}.parts/x/job-47.parquet.parts/{own.rsplit('/', 1)[1]}"
    s3.put(foreign, b"job 47's part")
    assert [str(p[3]) for p in parts._parts()] == [own]
    parts.remove_all()
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{final.key}.parts/")
            .get("Contents", [])]
    assert keys == [foreign]  # job 48 removed its own part only
    s3.client().delete_object(Bucket=BUCKET, Key=foreign)


def _part_table(first: int, rows: int) -> pa.Table:
    return pa.table({"index": pa.array(range(first, first + rows), pa.int64()),
                     "predicted_class": [3] * rows, "score": pa.array([0.5] * rows, pa.float32())})


def _body(s3: S3Server, key: str) -> tuple[bytes, dict[str, str]]:
    answer = s3.client().get_object(Bucket=BUCKET, Key=key)
    return answer["Body"].read(), answer["Metadata"]


@pytest.mark.parametrize("size", [100, 9 << 20])  # one PUT; a multipart upload
def test_a_write_replaces_no_object_another_writer_created(stack: Stack, tmp_path: Path,
                                                           size: int) -> None:
    s3, settings = S3Server.shared(), stack.settings
    url = ObjectURL(BUCKET, f"in/taken/{size}/job-1.parquet")
    data = tmp_path / "data"
    data.write_bytes(b"x" * size)
    s3.put(url.key, b"someone else's")
    with pytest.raises(ObjectTaken, match=f"{url} was created by another writer, not mxq job s/job-1"):
        s3c.create_from(settings, str(data), url, "s/job-1")
    assert _body(s3, url.key) == (b"someone else's", {})  # not replaced
    assert not s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix="in/taken/").get("Uploads")
    s3.client().delete_object(Bucket=BUCKET, Key=url.key)
    s3c.create_from(settings, str(data), url, "s/job-1")
    s3c.create_from(settings, str(data), url, "s/job-1")  # its own earlier write (an answer lost)
    assert _body(s3, url.key)[1] == {WRITER: "s/job-1"}
    with pytest.raises(ObjectTaken):
        s3c.create(settings, url, b"other", "s/job-2")  # (another stack's or job's: refused)
    s3.client().delete_object(Bucket=BUCKET, Key=url.key)


def test_a_merge_takes_and_removes_only_the_jobs_own_parts(stack: Stack, tmp_path: Path) -> None:
    """A part-named object another writer put under the job's parts prefix (here as a later
    attempt's, which the merge would prefer) is neither merged nor deleted; a merge done twice
    (after a crash) finds its own object and finishes."""
    s3 = S3Server.shared()
    final = ObjectURL(BUCKET, f"in/own/{stack_id(stack.settings.database)}/job-49.parquet")
    parts = BucketParts(stack.settings, final, tmp_path)
    first = parts.write_part([_part_table(0, 2)], "j49a1")
    assert first is not None and parts.write_part([_part_table(2, 2)], "j49a1") is not None
    assert parts.write_part([_part_table(0, 2)], "j49a1") == first  # a retried PUT: its own
    foreign = f"{final.key}.parts/000000000002-000000000004.j49a7.parquet"
    buf = io.BytesIO()
    pa.parquet.write_table(_part_table(2, 2), buf)
    s3.put(foreign, buf.getvalue())
    with pytest.raises(ObjectTaken, match=f"{foreign} was created by another writer"):
        parts.merge_if_complete(4)
    assert s3c.writer_of(stack.settings, final) is None  # nothing merged
    parts.remove_all()
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{final.key}.parts/")["Contents"]
    assert [o["Key"] for o in listed] == [foreign]  # its own parts went, the other's stayed
    s3.client().delete_object(Bucket=BUCKET, Key=foreign)

    assert parts.write_part([_part_table(0, 4)], "j49a2") is not None
    assert parts.merge_if_complete(4) and parts.rows_in() == 4
    merged = s3.client().head_object(Bucket=BUCKET, Key=final.key)["ETag"]
    assert parts.write_part([_part_table(0, 4)], "j49a3") is not None  # a later attempt's, then
    assert parts.merge_if_complete(4)  # ... the merge again: its own object stands
    assert s3.client().head_object(Bucket=BUCKET, Key=final.key)["ETag"] == merged
    assert s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{final.key}.")["KeyCount"] == 0
    s3.client().delete_object(Bucket=BUCKET, Key=final.key)


def _next_job_id(stack: Stack) -> int:
    with get_engine(stack.settings.database).connect() as conn:
        return int(conn.execute(text("SELECT coalesce(max(id), 0) FROM jobs")).scalar_one()) + 1


@pytest.mark.parametrize("output, whose", [("parquet", "another"), ("npy", "another"),
                                           ("parquet", "its own")])
def test_a_job_never_replaces_an_object_it_did_not_create(workers: Stack, mlp: dict, output: str,
                                                          whose: str) -> None:
    """An object at the exact key a job writes, a whole output of the right rows: another
    writer's stays and fails the job naming it (it was once taken as the job's merged output);
    the job's own (its merge done before a crash, as its metadata says) is accepted."""
    s3 = S3Server.shared()
    x = np.random.default_rng(11).normal(size=(3_000, 64)).astype(np.float32)
    url = s3.put(f"in/taken-{output}.npy", _npy(x))
    prefix, stack = f"in/taken-{output}-{whose.replace(' ', '-')}", stack_id(workers.settings.database)
    done = infer_and_wait(workers, "mlp64", url, "--output", output, "--output-to",
                          f"s3://{BUCKET}/{prefix}-first")  # an output of the very rows the job makes
    assert done["status"] == "succeeded", done["error"]
    body = _body(s3, done["output"].removeprefix(f"s3://{BUCKET}/"))[0]
    first = _next_job_id(workers)
    keys = {n: f"{prefix}/{stack}/job-{n}.{output}" for n in range(first, first + 5)}  # (a fire
    for n, key in keys.items():  # of another test's schedule could take an id first)
        s3.client().put_object(Bucket=BUCKET, Key=key, Body=body,
                               Metadata={WRITER: f"{stack}/job-{n}"} if whose == "its own" else {})
    job = infer_and_wait(workers, "mlp64", url, "--output", output, "--output-to",
                         f"s3://{BUCKET}/{prefix}", "--batch-size", "500")
    key = keys[job["id"]]
    if whose == "another":
        assert job["status"] == "failed"
        assert job["error"] == (f"output s3://{BUCKET}/{key} was created by another writer, not mxq "
                                f"job {stack}/job-{job['id']}: mxq never replaces (or merges) an "
                                "object it did not create; remove it, or give another --output-to")
        assert _body(s3, key) == (body, {})  # not replaced
    else:
        assert job["status"] == "succeeded", job["error"]
        assert job["output"] == f"s3://{BUCKET}/{key}"
    left = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]
    assert sorted(o["Key"] for o in left) == sorted(keys.values())  # no part left behind
    s3.client().delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys.values()]})
