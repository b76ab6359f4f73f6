"""One identity per stack: a home reused with another database never meets the old one's files.

What a stack keeps under its home (outputs, Parquet parts, the model store, checkpoints) is keyed
by the database's stack id (migration 0015, `mxq.db.stack`): a new database has a new id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxq.db import jobs
from mxq.db.fence import Fence
from mxq.db.jobs import Placement
from mxq.db.outputs import results
from mxq.db.outputs.results import OutputMissing, output_file
from mxq.db.stack import stack_id
from tests.conftest import run_cli


def _env(home: Path, db: str) -> dict[str, str]:
    return {"MXQ_HOME": str(home), "MXQ_DATABASE_URL": f"sqlite:///{home.parent / db}"}


def test_a_home_reused_with_a_new_database_meets_none_of_the_old_files(tmp_path: Path) -> None:
    home = tmp_path / "var"
    old, new = _env(home, "old.db"), _env(home, "new.db")
    for env in (old, new):
        assert run_cli(["migrate"], env).returncode == 0
    old_id, new_id = stack_id(old["MXQ_DATABASE_URL"]), stack_id(new["MXQ_DATABASE_URL"])
    assert old_id != new_id and len(new_id) == 16
    add = ["models", "add", "lenet1", "--arch", "mlp", "--input-shape", "4", "--classes", "3"]
    first = run_cli(add, old)
    assert first.returncode == 0, first.stderr
    again = run_cli(add, new)  # was: FileExistsError on models/lenet1/1, on every retry
    assert again.returncode == 0, again.stderr
    assert (home / "models" / old_id / "lenet1" / "1").is_dir()
    assert (home / "models" / new_id / "lenet1" / "1").is_dir()

    # Job 1 of each database: the old one's Parquet file is not the new one's output.
    url = new["MXQ_DATABASE_URL"]
    stale = output_file(home, old_id, 1, ".parquet")
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"PAR1 the old database's job 1")
    job_id = jobs.create_job(url, "infer", {"output": "parquet"}, "auto", "pool.cpu")
    assert job_id == 1
    fence = jobs.take(url, job_id, Placement("cpu0@n", "n", "cpu:0"), 3, 30.0)
    assert isinstance(fence, Fence)
    assert jobs.succeed(url, fence, 10, 1.0, {})
    record = {"id": job_id, "params": {"output": "parquet"}, "status": "succeeded", "result": {}}
    with pytest.raises(OutputMissing, match=f"job 1's output .*/{new_id}/job-1.parquet is missing"):
        results.read(url, home, record)  # type: ignore[arg-type]


def test_an_npy_only_job_returns_its_rows(tmp_path: Path) -> None:
    """Succeeded npy-only jobs returned no rows (exit 0); a cancelled one only what it stored."""
    home = tmp_path / "var"
    url = f"sqlite:///{tmp_path / 'mxq.db'}"
    assert run_cli(["migrate"], {"MXQ_HOME": str(home), "MXQ_DATABASE_URL": url}).returncode == 0
    probs = np.random.default_rng(1).dirichlet(np.ones(4), size=10).astype(np.float32)
    path = output_file(home, stack_id(url), 7, ".npy")
    path.parent.mkdir(parents=True)
    np.save(path, probs)
    record = {"id": 7, "params": {"output": "npy", "top_k": 2}, "status": "succeeded",
              "result": {"output": str(path)}}
    rows = results.read(url, home, record, limit=3, offset=2)  # type: ignore[arg-type]
    assert [r["index"] for r in rows] == [2, 3, 4]
    assert [r["predicted_class"] for r in rows] == probs[2:5].argmax(axis=1).tolist()
    top = rows[0]["top_k"]
    assert top is not None and top[0][0] == int(probs[2].argmax())
    assert results.count(url, home, record) == 10  # type: ignore[arg-type]
    probs[5:] = 0  # a cancelled job computed [0, 5) only
    np.save(path, probs)
    cancelled = {**record, "status": "cancelled"}
    assert results.count(url, home, cancelled) == 5  # type: ignore[arg-type]
    assert [r["index"] for r in results.read(url, home, cancelled)] == [0, 1, 2, 3, 4]  # type: ignore[arg-type]
