"""A training's data: its dataset loaded and split, scaled as the net sees it, and what the
version it registers will be (a built-in or registered architecture's, or the version a training
--from starts from); a problem with them is the job's one line (`BadInput`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mxq.db import registry
from mxq.db.records import ModelRecord
from mxq.db.registry import ModelNotFound
from mxq.objects import ObjectURLError
from mxq.preprocess import Preprocess, PreprocessError
from mxq.tasks.inference.inputs import InputError, Limits
from mxq.tasks.model_store.mxnet.versions import TrainedVersion
from mxq.tasks.model_store.zoo import ArchError, check_shape
from mxq.tasks.training import datasets
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.paths import PathError
from mxq.workers.settings import Settings
from mxq.workers.storage.client import StorageError
from mxq.workers.storage.locate import locate


class BadInput(Exception):
    """A dataset or architecture problem, reported as the job's error."""


@dataclass
class Data:
    """A training's samples as its net sees them, and what the version it registers is."""

    train: datasets.Dataset
    val: datasets.Dataset | None
    val_raw: datasets.Dataset | None  # as stored: a promoted version is judged on it with its own scaling
    version: TrainedVersion
    source: ModelRecord | None  # the version a training --from starts from


def load_data(s: Settings, p: TrainParams) -> Data:
    source = None if p.from_model is None else registry.resolve(s.database, p.from_model,
                                                                 p.from_version)
    try:
        path = p.dataset if p.dataset in datasets.BUILTIN else locate(s, p.dataset, "dataset")
        shape = p.input_shape or (source["input_shape"] if source else None)
        ds = datasets.load(path, tuple(shape) if shape else None, p.label_column, Limits.of(s))
        if source is None and p.arch_sha256 is None:  # (a registered architecture's: its trial)
            check_shape(p.arch or "", ds.sample_shape)
        ds = replace(ds, preprocess=_preprocessing(s, p, ds, source))
        ds.preprocess.check(ds.sample_shape)
    except (InputError, PathError, ObjectURLError, StorageError, ArchError, PreprocessError) as exc:
        raise BadInput(str(exc)) from None
    version = _version(s, p, ds, source)
    train, val = datasets.split(ds, p.val_fraction, p.seed)
    return Data(train.for_training(), val and val.for_training(), val, version, source)


def _version(s: Settings, p: TrainParams, ds: datasets.Dataset, source: ModelRecord | None) -> TrainedVersion:
    """What the trained version will be: a built-in architecture's from the dataset, or the
    same input shape, classes and outputs as the version a training --from starts from."""
    if source is None:
        known = registry.list_models(s.database, p.name)
        if known and ds.classes > known[-1]["classes"]:
            raise BadInput(f"dataset {p.dataset} has labels up to {ds.classes - 1} but model {p.name} "
                           f"has {known[-1]['classes']} classes (0..{known[-1]['classes'] - 1})")
        return TrainedVersion(p.arch or "", ds.sample_shape, ds.classes, ds.preprocess,
                              code=f"{p.arch}@{p.arch_sha256}" if p.arch_sha256 else None)
    label = f"{source['name']}:{source['version']}"
    if ds.sample_shape != tuple(source["input_shape"]):
        raise BadInput(f"dataset {p.dataset} has samples of shape {ds.sample_shape} but {label} "
                       f"takes {tuple(source['input_shape'])}")
    if ds.classes > source["classes"]:
        raise BadInput(f"dataset {p.dataset} has labels up to {ds.classes - 1} but {label} has "
                       f"{source['classes']} classes (0..{source['classes'] - 1})")
    return TrainedVersion(source["arch"], ds.sample_shape, source["classes"], ds.preprocess,
                   source["outputs"], label)


def _preprocessing(s: Settings, p: TrainParams, ds: datasets.Dataset,
                   source: ModelRecord | None) -> Preprocess:
    """How the net sees its inputs: the options given; else as the version it starts from, or
    the model's promoted (else newest) version, serves (a retraining must see its inputs as
    serving does); else the dataset's own (digits: over 16)."""
    given = p.preprocessing()
    if given is not None:
        return given
    if source is not None:
        return Preprocess.from_dict(source["preprocess"])
    try:
        stored = Preprocess.from_dict(registry.resolve(s.database, p.name)["preprocess"])
    except ModelNotFound:
        return ds.preprocess
    return ds.preprocess if stored.identity else stored
