"""The S3 client of a process, through boto3: credentials from the standard AWS chain
(environment, shared config files, an instance role), the endpoint of an S3-compatible server
from MXQ_S3_ENDPOINT_URL. s3fs and obstore read as fast here (docs/object-storage.md: all three
at 67-78 MB/s from moto); boto3 is chosen because a worker reads from its own threads with plain
blocking calls (s3fs runs an asyncio loop beside them, and its aiobotocore pinned botocore back
to an older release), and its errors carry the server's codes that mxq's messages name.

Credentials never appear in what mxq writes: its errors name the operation, the object and the
server's error code only (`StorageError`), and botocore's own loggers are kept at WARNING, where
they log no request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mxq.errors import MxqError, Unavailable, UserError
from mxq.objects import ObjectURL

if TYPE_CHECKING:
    from mxq.workers.settings import Settings

# Seconds to connect and to wait for a read: a server that hangs fails the read (the job is
# retried) instead of leaving the worker in a recv() for good.
CONNECT_SECONDS, READ_SECONDS = 10.0, 60.0
RETRIES = 5  # botocore's "standard" retry mode, on throttling and 5xx answers
DEFAULT_REGION = "us-east-1"  # an S3-compatible server takes any; AWS's chain may name another
# Errors the server answers for a missing object or bucket, or one the credentials may not read.
MISSING = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}
DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}

_lock = threading.Lock()


class StorageError(UserError):
    """An object that is missing or may not be read: the job's input is wrong."""


class StorageUnavailable(Unavailable):
    """The object store did not answer (down, unreachable, throttling past every retry)."""


def quiet_botocore() -> None:
    """botocore logs requests (headers with the signature and access key id) at DEBUG."""
    for name in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(name).setLevel(max(logging.getLogger(name).level, logging.WARNING))


@lru_cache(maxsize=4)
def _client(endpoint: str | None) -> Any:
    import boto3
    from botocore.config import Config

    quiet_botocore()
    with _lock:  # boto3's default session is not thread-safe while it builds a client
        session = boto3.session.Session()
        return session.client("s3", endpoint_url=endpoint,
                              region_name=session.region_name or DEFAULT_REGION,
                              config=Config(connect_timeout=CONNECT_SECONDS, read_timeout=READ_SECONDS,
                                            retries={"max_attempts": RETRIES, "mode": "standard"},
                                            max_pool_connections=16))


def client(settings: Settings) -> Any:
    """This process's S3 client for the stack's endpoint (boto3 clients are thread-safe)."""
    return _client(settings.s3_endpoint_url)


def _code(exc: Exception) -> str | None:
    """The error code an S3 server answered with, if `exc` is such an answer."""
    from botocore.exceptions import ClientError

    return str(exc.response.get("Error", {}).get("Code", "?")) if isinstance(exc, ClientError) else None


def explained(exc: Exception, operation: str, url: ObjectURL) -> Exception:
    """A botocore error as mxq's: what was done to which object, and the server's code only."""
    from botocore.exceptions import BotoCoreError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return StorageError(f"cannot {operation} {url}: no credentials found (set AWS_ACCESS_KEY_ID "
                            "and AWS_SECRET_ACCESS_KEY, a profile in ~/.aws, or an instance role)")
    code = _code(exc)
    if code in MISSING:
        return StorageError(f"cannot {operation} {url}: it does not exist")
    if code in DENIED:
        return StorageError(f"cannot {operation} {url}: access denied ({code}) with the "
                            "credentials of the AWS chain")
    if code is not None:
        return StorageUnavailable(f"cannot {operation} {url}: the object store answered {code}")
    if isinstance(exc, BotoCoreError):
        return StorageUnavailable(f"cannot {operation} {url}: {type(exc).__name__} (is the object "
                                  "store up, and MXQ_S3_ENDPOINT_URL right?)")
    return exc


@contextmanager
def _as_mxq(operation: str, url: ObjectURL) -> Iterator[None]:
    """botocore's errors inside the block raised as mxq's (`explained`), without their chain."""
    try:
        yield
    except MxqError:
        raise
    except Exception as exc:
        raise explained(exc, operation, url) from None


def size_of(settings: Settings, url: ObjectURL) -> int:
    """The object's size in bytes, from one HEAD request."""
    with _as_mxq("read", url):
        return int(client(settings).head_object(Bucket=url.bucket, Key=url.key)["ContentLength"])


def exists(settings: Settings, url: ObjectURL) -> bool:
    try:
        client(settings).head_object(Bucket=url.bucket, Key=url.key)
    except Exception as exc:
        if _code(exc) in MISSING:
            return False
        raise explained(exc, "read", url) from None
    return True


READ_CHUNK_BYTES = 1 << 20  # a ranged GET's body is copied into its buffer this much at a time


def read_range(settings: Settings, url: ObjectURL, start: int, stop: int,
               into: bytearray | None = None) -> memoryview:
    """Bytes [start, stop) of the object, from one ranged GET, read a chunk at a time into `into`
    (reused by a reader: fresh buffers of megabytes, freed from several threads, fragment the
    heap and the worker's memory grows), else into a new buffer; the part of it filled."""
    size = max(0, stop - start)
    data = into if into is not None and len(into) >= size else bytearray(size)
    view, done = memoryview(data), 0
    if not size:
        return view[:0]
    with _as_mxq("read", url):
        body = client(settings).get_object(Bucket=url.bucket, Key=url.key,
                                           Range=f"bytes={start}-{stop - 1}")["Body"]
        while done < size and (chunk := body.read(min(READ_CHUNK_BYTES, size - done))):
            view[done:done + len(chunk)] = chunk
            done += len(chunk)
        body.close()
    return view[:done]


def get(settings: Settings, url: ObjectURL) -> bytes:
    """A small object whole (a part, an image), from one GET."""
    with _as_mxq("read", url):
        data: bytes = client(settings).get_object(Bucket=url.bucket, Key=url.key)["Body"].read()
    return data


def put(settings: Settings, url: ObjectURL, data: bytes) -> None:
    """One object written whole by a single PUT: it appears complete or not at all."""
    with _as_mxq("write", url):
        client(settings).put_object(Bucket=url.bucket, Key=url.key, Body=data)


def upload(settings: Settings, path: str, url: ObjectURL) -> None:
    """A local file uploaded as one object (multipart past 8 MiB, by s3transfer): the object
    appears when its last part is in, never half."""
    with _as_mxq("write", url):
        client(settings).upload_file(path, url.bucket, url.key)


def download(settings: Settings, url: ObjectURL, path: str) -> None:
    """An object saved as the local file `path` (by ranged parts, by s3transfer)."""
    with _as_mxq("read", url):
        client(settings).download_file(url.bucket, url.key, path)


UNBOUNDED = 2**62  # a listing of what mxq wrote itself (a job's parts) needs no bound


def listed(settings: Settings, url: ObjectURL, most: int = UNBOUNDED) -> list[tuple[str, float, int]]:
    """(key, last modified as a POSIX time, size) of the objects whose key starts with `url`'s,
    at most `most` of them (StorageError past it: a listing of a user's prefix stays bounded)."""
    found: list[tuple[str, float, int]] = []
    with _as_mxq("list", url):
        pages = client(settings).get_paginator("list_objects_v2").paginate(Bucket=url.bucket,
                                                                             Prefix=url.key)
        for page in pages:
            found += [(o["Key"], o["LastModified"].timestamp(), int(o["Size"]))
                      for o in page.get("Contents", [])]
            if len(found) > most:
                raise StorageError(f"{url} holds more than {most:,} objects: narrow the prefix")
    return found


def delete(settings: Settings, url: ObjectURL, keys: list[str]) -> None:
    """Remove `keys` of `url`'s bucket (a missing one is no error), a thousand per request."""
    with _as_mxq("delete", url):
        for i in range(0, len(keys), 1000):
            client(settings).delete_objects(Bucket=url.bucket, Delete={
                "Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def abort_uploads(settings: Settings, url: ObjectURL) -> None:
    """Abort the unfinished multipart uploads of `url`'s key (a merge that died mid-upload
    leaves its parts billed and invisible)."""
    with _as_mxq("clean up", url):
        s3 = client(settings)
        for upload in s3.list_multipart_uploads(Bucket=url.bucket, Prefix=url.key).get("Uploads", []):
            if upload["Key"] == url.key:
                s3.abort_multipart_upload(Bucket=url.bucket, Key=url.key, UploadId=upload["UploadId"])
