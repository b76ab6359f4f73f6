"""Where a version's files live: its folder on this node, and the model store in a bucket
(MXQ_S3_MODEL_STORE), so that every node of a fleet serves every version with no shared folder.

The folder is `models/STACK/NAME/VERSION` under the home, STACK the database's id (a home reused
with another database never meets the old versions' folders); the name is checked where it
becomes a path.

A registration uploads the version's files (symbol, params, ONNX export) to
`PREFIX/STACK/NAME/VERSION/FILE` before it writes the version's row: a version any node can see
in SQL is in the bucket. A node that lacks a recorded file (it was registered on another host)
fetches it once into its own `$MXQ_HOME/models/STACK/NAME/VERSION/`, by a temporary name renamed
into place, and serves it from there; the checksums recorded at registration prove what was
fetched, as they prove a local file (`checksums.verify`).

An architecture's code (`mxq arch add`) is stored the same way by its checksum:
`models/STACK/.archs/SHA256.py` on the node that registered it and `PREFIX/STACK/.archs/SHA256.py`
in the bucket store, fetched once by any other node; its checksum is checked before every import.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from mxq.db.records import ModelRecord
from mxq.objects import ObjectURL
from mxq.workers.settings import Settings
from mxq.workers.storage import client as s3
from mxq.workers.storage.versions import arch_dir, arch_object, store_dir, store_object

__all__ = ["arch_file", "local_file", "publish", "store_arch", "store_dir"]


def publish(settings: Settings, url: str, name: str, version: int, files: list[Path]) -> None:
    """Upload a new version's files, when the store is in a bucket."""
    if settings.s3_model_store is None:
        return
    for path in files:
        s3.upload(settings, str(path), store_object(settings.s3_model_store, url, name, version, path.name))


def local_file(settings: Settings, model: ModelRecord, recorded: str) -> Path:
    """The recorded file of a version where this node can read it. Without a bucket store, the
    recorded path. With one, a node reads only under its own home: the recorded path when this
    node wrote it, else its own copy, fetched from the bucket on first use (a path another node
    recorded names that node's disk, even where the same path exists here)."""
    path = Path(recorded)
    if settings.s3_model_store is None or (path.is_relative_to(settings.home_path)
                                           and path.is_file()):
        return path
    url = settings.database
    copy = store_dir(settings.home_path, url, model["name"], model["version"]) / path.name
    if not copy.is_file():
        _fetch(settings, store_object(settings.s3_model_store, url, model["name"], model["version"],
                                      path.name), copy)
    return copy


def _fetch(settings: Settings, obj: ObjectURL, copy: Path) -> None:
    """Download `obj` to `copy`, by a temporary name renamed into place."""
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_name(f".{copy.name}.{os.getpid()}.tmp")
    try:
        s3.download(settings, obj, str(tmp))
        os.replace(tmp, copy)
    finally:
        tmp.unlink(missing_ok=True)


class CodeMissing(Exception):
    """An architecture's stored code that is not there, or not the bytes it was registered as."""


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_arch(settings: Settings, source: Path, sha256: str) -> Path:
    """Keep an architecture's file by its checksum on this node (and in the bucket store)."""
    url = settings.database
    path = arch_dir(settings.home_path, url) / f"{sha256}.py"
    if not path.is_file() or sha256_of(path) != sha256:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        shutil.copyfile(source, tmp)
        os.replace(tmp, path)
    if settings.s3_model_store is not None:
        s3.upload(settings, str(path), arch_object(settings.s3_model_store, url, sha256))
    return path


def arch_file(settings: Settings, sha256: str) -> Path:
    """An architecture's code where this node can read it, fetched from the bucket store on
    first use; CodeMissing unless its bytes are the ones registered."""
    url = settings.database
    path = arch_dir(settings.home_path, url) / f"{sha256}.py"
    if not path.is_file() and settings.s3_model_store is not None:
        _fetch(settings, arch_object(settings.s3_model_store, url, sha256), path)
    if not path.is_file():
        raise CodeMissing(f"the architecture's code {sha256[:12]} is not stored on this node"
                          + ("" if settings.s3_model_store else " (no MXQ_S3_MODEL_STORE to fetch it from)"))
    if sha256_of(path) != sha256:
        raise CodeMissing(f"the architecture's code {path} is not the file registered as {sha256[:12]}")
    return path
