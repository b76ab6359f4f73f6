"""Where a model version's files live, by name: this node's folder of it
(`$MXQ_HOME/models/STACK/NAME/VERSION`) and its objects in the bucket store
(`PREFIX/STACK/NAME/VERSION/FILE`, MXQ_S3_MODEL_STORE); and removing both, for the retention
policy. The architectures' code (`mxq arch add`) lives beside them, by checksum, in `.archs`.
The model store itself (registering, publishing, fetching) is tasks/model_store's."""

from __future__ import annotations

import shutil
from pathlib import Path

from mxq.db.stack import stack_id
from mxq.names import check_name
from mxq.objects import ObjectURL, parse
from mxq.workers.settings import Settings
from mxq.workers.storage import client as s3


def store_dir(home: Path, url: str, name: str, version: int) -> Path:
    """This node's folder of a version."""
    return home / "models" / stack_id(url) / check_name(name) / str(version)


def store_object(store: str, url: str, name: str, version: int, filename: str) -> ObjectURL:
    """A version's file in the bucket store."""
    prefix = parse(store, "MXQ_S3_MODEL_STORE")
    return ObjectURL(prefix.bucket, f"{prefix.key}/{stack_id(url)}/{name}/{version}/{filename}")


ARCHS = ".archs"  # the architectures' code, beside the models' folders (no model is named so)


def arch_dir(home: Path, url: str) -> Path:
    """This node's folder of the architectures' code, each file named by its checksum."""
    return home / "models" / stack_id(url) / ARCHS


def arch_object(store: str, url: str, sha256: str) -> ObjectURL:
    """An architecture's code in the bucket store: `PREFIX/STACK/.archs/SHA256.py`."""
    prefix = parse(store, "MXQ_S3_MODEL_STORE")
    return ObjectURL(prefix.bucket, f"{prefix.key}/{stack_id(url)}/{ARCHS}/{sha256}.py")


def remove_version(settings: Settings, name: str, version: int, files: list[str]) -> None:
    """Remove a version's folder on this node and, with a bucket store, its objects (`files`:
    what its row records)."""
    url = settings.database
    shutil.rmtree(store_dir(settings.home_path, url, name, version), ignore_errors=True)
    if settings.s3_model_store is not None and files:
        first = store_object(settings.s3_model_store, url, name, version, "x")
        keys = [store_object(settings.s3_model_store, url, name, version, Path(f).name).key for f in files]
        s3.delete(settings, first, keys)
