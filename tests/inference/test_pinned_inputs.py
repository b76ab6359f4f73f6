"""What a job reads is what was submitted (issue 44, item 2): a local file's size, mtime and
inode, an object's ETag, pinned at submit; a file rewritten or an object replaced before or
while the job reads it fails the job naming it, and never mixes two versions in one output."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from mxq.tasks.fixed_costs import FixedCosts
from mxq.tasks.inference import engines, infer
from mxq.tasks.inference.batch_fit import BatchFit
from mxq.tasks.inference.inputs import InputError
from mxq.tasks.inference.submitted_input import open_submitted
from mxq.tasks.job_context import JobContext, JobInputError
from mxq.workers.fleet.hang_watch import DeviceWatch
from mxq.workers.jobs.jobspecs import InferParams
from mxq.workers.jobs.kinds.infer import resolve_infer
from mxq.workers.settings import get_settings
from mxq.workers.storage.client import ObjectChanged
from mxq.workers.storage.locate import identity, locate
from mxq.workers.storage.ranged import RemoteObject, RemotePrefix
from tests.conftest import Stack
from tests.support.images import png_bytes, solid
from tests.support.s3 import S3Server


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


@pytest.fixture
def in_stack(workers: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """This process reads the stack's settings, as its device workers do (`open_submitted` reads the
    process's)."""
    for name, value in workers.env.items():
        if name.startswith(("MXQ_", "AWS_")):
            monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield workers
    monkeypatch.undo()
    get_settings.cache_clear()


def _prepared(stack: Stack, mlp: dict, where: str) -> tuple[InferParams, Any]:
    """The job's parameters as submit stores them, and the model record."""
    params = resolve_infer(stack.settings, InferParams(model="mlp64", input=where), {})
    assert params.input_identity is not None
    return params, mlp


def test_a_file_rewritten_before_or_during_the_read_fails_the_job(in_stack: Stack, mlp: dict) -> None:
    workers = in_stack
    path = workers.home / "data" / "pinned.npy"
    np.save(path, np.ones((4000, 64), np.float32))
    p, model = _prepared(workers, mlp, "pinned.npy")
    source = open_submitted(in_stack.settings, p, model)
    first = source.read(0, 100)
    assert first.shape == (100, 64)
    with open(path, "r+b") as f:  # the same size, other bytes, in place (the same inode)
        f.seek(-64 * 4, os.SEEK_END)
        f.write(np.zeros(64, np.float32).tobytes())
    with pytest.raises(InputError, match="changed since the job was submitted"):
        source.read(100, 200)
    with pytest.raises(JobInputError, match=r"pinned.npy changed since the job was submitted"):
        open_submitted(in_stack.settings, p, model)  # a later attempt (a resume) is refused too


def test_an_object_replaced_while_it_is_read_fails_the_read(in_stack: Stack, mlp: dict) -> None:
    workers = in_stack
    s3 = S3Server.shared()
    url = s3.put("in/pinned.npy", _npy(np.ones((4000, 64), np.float32)))
    p, model = _prepared(workers, mlp, url)
    obj = locate(workers.settings, url)
    assert isinstance(obj, RemoteObject) and obj.etag
    with obj.open(block=4096, ahead=0) as reader:
        assert len(reader.read(4096)) == 4096
        s3.put("in/pinned.npy", _npy(np.zeros((4000, 64), np.float32)))  # same size, new ETag
        with pytest.raises(ObjectChanged, match="was replaced while the job read it"):
            reader.read(4096)
    with pytest.raises(JobInputError, match="changed since the job was submitted"):
        open_submitted(in_stack.settings, p, model)


def _images(mlp: dict) -> Any:
    """The model record `open_submitted` reads, as one that takes 3x4x6 images (`solid`'s)."""
    return {**mlp, "input_shape": [3, 4, 6]}


def test_an_image_rewritten_in_a_listed_folder_fails_the_job(in_stack: Stack, mlp: dict) -> None:
    """A folder's images were read with no check: one rewritten after the listing was scored in
    its new version beside the others' old ones."""
    folder = in_stack.home / "data" / "pinned-imgs"
    folder.mkdir()
    for i, name in enumerate(["a.png", "b.png", "c.png"]):
        (folder / name).write_bytes(png_bytes(solid((40 * i, 100, 200))))
    p, model = _prepared(in_stack, mlp, "pinned-imgs")
    source = open_submitted(in_stack.settings, p, _images(model))
    assert source.read(0, 1).shape == (1, 3, 4, 6)
    with open(folder / "b.png", "r+b") as f:  # other pixels, the same size, in place
        f.write(png_bytes(solid((250, 0, 0))))
    if identity(folder) == p.input_identity:  # a coarse clock gave the rewrite the same mtime
        st = os.stat(folder / "b.png")
        os.utime(folder / "b.png", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(InputError, match=r"pinned-imgs/b.png changed since the job listed its folder"):
        source.read(1, 2)
    with pytest.raises(JobInputError, match=r"pinned-imgs changed since the job was submitted"):
        open_submitted(in_stack.settings, p, _images(model))  # a chunk or a later attempt lists anew: refused


def test_an_image_replaced_under_a_listed_prefix_fails_the_job(in_stack: Stack, mlp: dict) -> None:
    """A prefix's images were read with no ETag: one replaced after the listing was scored in
    its new version beside the others' old ones."""
    s3 = S3Server.shared()
    for i, name in enumerate(["a.png", "b.png", "c.png"]):
        s3.put(f"in/pinned-scans/{name}", png_bytes(solid((40 * i, 100, 200))))
    p, model = _prepared(in_stack, mlp, "s3://mxq-tests/in/pinned-scans/")
    source = open_submitted(in_stack.settings, p, _images(model))
    assert isinstance(source.path, RemotePrefix)
    assert source.read(0, 1).shape == (1, 3, 4, 6)
    s3.put("in/pinned-scans/b.png", png_bytes(solid((250, 0, 0))))  # the same size, a new ETag
    with pytest.raises(ObjectChanged, match=r"^input s3://mxq-tests/in/pinned-scans/b.png changed "
                                            "since the job listed s3://mxq-tests/in/pinned-scans/"):
        source.read(1, 2)
    with pytest.raises(JobInputError, match=r"pinned-scans/ changed since the job was submitted"):
        open_submitted(in_stack.settings, p, _images(model))


class _Kept:
    """The output `_stream` hands predictions to: how many samples it took, nothing stored."""

    start, stop, classes, holds_results = 0, 8000, 10, True
    added = 0

    def add(self, first: int, probs: np.ndarray) -> None:
        self.added += len(probs)

    def take(self, *args: Any) -> Any:
        return args

    def store(self, item: Any) -> None:
        pass


def test_a_file_rewritten_while_the_model_reads_the_last_batch_fails_the_job(
        in_stack: Stack, mlp: dict) -> None:
    """A mapped .npy's read is a view: the model reads the file after the read's own check, and
    after the last batch nothing checked it again (such a job succeeded with two versions)."""
    path = in_stack.home / "data" / "pinned-last.npy"
    np.save(path, np.ones((8000, 64), np.float32))  # 2 MiB: memory-mapped, not read whole
    p, model = _prepared(in_stack, mlp, "pinned-last.npy")
    source, out, seen = open_submitted(in_stack.settings, p, model), _Kept(), [0]
    submitted = identity(path)

    def forward(x: np.ndarray) -> np.ndarray:
        """Rewrites the file in place (same size and inode) while the model reads the last batch."""
        seen[0] += len(x)
        if seen[0] == source.count:
            with open(path, "r+b") as f:
                f.seek(-64 * 4, os.SEEK_END)
                f.write(np.zeros(64, np.float32).tobytes())
            if identity(path) == submitted:  # a coarse clock gave the rewrite the same mtime
                st = os.stat(path)
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        return np.full((len(x), 10), 0.1, np.float32)

    engine = engines.Engine("onnx", forward, lambda: None, False, "")
    job = cast("JobContext", SimpleNamespace(
        url="", id=1, parsed_device=SimpleNamespace(kind="gpu"), preempt_asked=lambda: False,
        check_cancelled=lambda done: None, watch=DeviceWatch(300, 10),
        costs=FixedCosts(0.0)))
    with pytest.raises(JobInputError, match=r"pinned-last.npy changed since the job was submitted"):
        infer._stream(job, p, source, engine, cast(Any, out), 0, BatchFit(job, 1000))
    assert seen[0] == source.count and out.added < source.count  # the last read was never kept
