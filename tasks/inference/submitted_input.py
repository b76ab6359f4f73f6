"""The input of an inference job held to what was submitted (`InferParams.input_identity`): a
file, an object or a folder that changed since fails the job, naming it, before anything of the
new bytes is stored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mxq.db.records import ModelRecord
from mxq.objects import ObjectURLError
from mxq.preprocess import Preprocess
from mxq.tasks.inference.inputs import InputError, InputSource, Limits, open_input
from mxq.tasks.inference.inputs.source import Fetch
from mxq.tasks.job_context import JobInputError
from mxq.workers.jobs.jobspecs import InferParams
from mxq.workers.paths import PathError
from mxq.workers.settings import Settings
from mxq.workers.storage.client import StorageError
from mxq.workers.storage.locate import identity, locate


def open_submitted(s: Settings, p: InferParams, model: ModelRecord) -> InputSource:
    """The job's input as it was submitted (`p.input_identity`): an object read only at the
    ETag it had (If-Match on every range), a file whose size, mtime and inode are checked again
    after every read and after the model computed it (`unchanged`), a folder's or a prefix's
    images as listed at submit, each read checked against its listing (`inputs.images`); a
    change fails the job, naming it, before anything of the new bytes is stored."""
    try:
        path = locate(s, p.input)
        folder = isinstance(path, Path) and path.is_dir()
        if not folder:  # a folder's identity (a listing and a stat per image) is taken once, below
            _same_input(p, identity(path))
        source = open_input(path, tuple(model["input_shape"]), p.key,
                            Preprocess.from_dict(model["preprocess"]), Limits.of(s), p.columns)
        if folder:  # the listing the reads are held to: submit's
            _same_input(p, identity(path))
    except (PathError, ObjectURLError, StorageError, InputError) as exc:
        raise JobInputError(str(exc)) from None
    if isinstance(path, Path) and not folder and p.input_identity is not None:
        source.fetch = _pinned(p, path, source.fetch)
    source.model = f"{model['name']}:{model['version']}"
    return source


def _same_input(p: InferParams, now: str | None) -> None:
    if p.input_identity is not None and now != p.input_identity:
        raise InputError(f"input {p.input} changed since the job was submitted (then: "
                         f"{p.input_identity}; now: {now or 'gone'}): submit the job again to "
                         "score the new contents")


def _pinned(p: InferParams, path: Path, fetch: Fetch) -> Fetch:
    """`fetch`, checking after each read that the file is still the one submitted: a file
    rewritten in place under a mapped read changes the bytes already read, not only later ones."""
    def checked(start: int, stop: int) -> NDArray[np.generic]:
        samples = fetch(start, stop)
        _same_input(p, identity(path))  # (an InputError: the read's caller fails the job with it)
        return samples
    return checked


def unchanged(p: InferParams, source: InputSource) -> None:
    """Fail the job if its local input is no longer the one submitted. Checked once the model has
    read a batch: a mapped .npy's fetch is a view of the file, so a rewrite after the fetch's own
    check (during the last batch too) would otherwise reach the predictions of a job that succeeds."""
    if isinstance(source.path, Path) and not source.path.is_dir() and p.input_identity is not None:
        try:  # (a folder's images are copied as they are read, each checked then)
            _same_input(p, identity(source.path))
        except InputError as exc:
            raise JobInputError(str(exc)) from None
