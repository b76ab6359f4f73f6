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
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import lru_cache
from typing import Any, TypeVar

from mxq.errors import MxqError, Unavailable, UserError
from mxq.objects import ObjectURL
from mxq.workers.settings import Settings
from mxq.workers.settings.storage import StorageSettings

# Each call waits at most MXQ_S3_TIMEOUT_SECONDS (45 s by default), its retries included
# (botocore's "standard" mode retries throttling, 5xx answers and timeouts, with a backoff of a
# second or two): up to ATTEMPTS tries of an equal share of it, none shorter than MIN_TRY_SECONDS,
# and at most CONNECT_SECONDS of each to connect. A server that hangs fails a request within about
# that bound, a 503 from the API, a retry of the job, instead of leaving a caller in a recv() for
# minutes (60 s and 6 tries measured 6 minutes for a submit).
CONNECT_SECONDS = 5.0
ATTEMPTS = 3
MIN_TRY_SECONDS = 1.0
DEFAULT_REGION = "us-east-1"  # an S3-compatible server takes any; AWS's chain may name another
# Errors the server answers for a missing object or bucket, or one the credentials may not read.
MISSING = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}
DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}

_lock = threading.Lock()
T = TypeVar("T")
# boto3 ships no types: its S3 client, and each answer and listed object (a dict of the server's
# fields), are untyped; these two names say where they flow.
S3Client = Any
S3Answer = dict[str, Any]
# What every function here takes: a process's settings or object storage's part of them alone.
StorageConfig = Settings | StorageSettings
# One uploaded part of a multipart upload, as CompleteMultipartUpload takes it.
UploadedPart = dict[str, str | int]


class StorageError(UserError):
    """An object that is missing or may not be read: the job's input is wrong."""


class StorageUnavailable(Unavailable):
    """The object store did not answer (down, unreachable, throttling past every retry)."""


def quiet_botocore() -> None:
    """botocore logs requests (headers with the signature and access key id) at DEBUG."""
    for name in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(name).setLevel(max(logging.getLogger(name).level, logging.WARNING))


def bounds(seconds: float) -> tuple[float, float, int]:
    """The connect and read timeouts of one try and the tries of a call bounded by `seconds`."""
    tries = max(1, min(ATTEMPTS, int(seconds // MIN_TRY_SECONDS)))
    read = seconds / tries
    return min(CONNECT_SECONDS, read), read, tries


@lru_cache(maxsize=4)
def _client(endpoint: str | None, seconds: float) -> S3Client:
    import boto3
    from botocore.config import Config

    quiet_botocore()
    connect, read, tries = bounds(seconds)
    with _lock:  # boto3's default session is not thread-safe while it builds a client
        session = boto3.session.Session()
        return session.client("s3", endpoint_url=endpoint,
                              region_name=session.region_name or DEFAULT_REGION,
                              config=Config(connect_timeout=connect, read_timeout=read,
                                            retries={"total_max_attempts": tries, "mode": "standard"},
                                            max_pool_connections=16))


def storage_of(settings: StorageConfig) -> StorageSettings:
    """Object storage's part of `settings` (every function here takes a process's settings or
    that part alone, so that a caller holding either passes it as it is)."""
    return settings if isinstance(settings, StorageSettings) else settings.storage


def client(settings: StorageConfig) -> S3Client:
    """This process's S3 client for the stack's endpoint and bound (boto3 clients are
    thread-safe): one per endpoint and MXQ_S3_TIMEOUT_SECONDS, so a changed setting takes effect."""
    storage = storage_of(settings)
    return _client(storage.endpoint_url, storage.timeout_seconds)


def _code(exc: Exception) -> str | None:
    """The error code an S3 server answered with, if `exc` is such an answer."""
    from botocore.exceptions import ClientError

    return str(exc.response.get("Error", {}).get("Code", "?")) if isinstance(exc, ClientError) else None


def explained(exc: Exception, operation: str, url: ObjectURL, settings: StorageConfig) -> Exception:
    """A botocore error as mxq's: what was done to which object, and the server's code only."""
    from botocore.exceptions import BotoCoreError, ConnectTimeoutError, NoCredentialsError, ReadTimeoutError

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
    if isinstance(exc, ConnectTimeoutError | ReadTimeoutError):
        seconds = storage_of(settings).timeout_seconds
        _, read, tries = bounds(seconds)
        return StorageUnavailable(f"cannot {operation} {url}: the object store gave no answer in "
                                  f"{seconds:g} s ({tries} tries of {read:g} s, "
                                  "MXQ_S3_TIMEOUT_SECONDS; is it up, and MXQ_S3_ENDPOINT_URL right?)")
    if isinstance(exc, BotoCoreError):
        return StorageUnavailable(f"cannot {operation} {url}: {type(exc).__name__} (is the object "
                                  "store up, and MXQ_S3_ENDPOINT_URL right?)")
    return exc


@contextmanager
def _as_mxq(settings: StorageConfig, operation: str, url: ObjectURL) -> Iterator[None]:
    """botocore's errors inside the block raised as mxq's (`explained`), without their chain."""
    try:
        yield
    except MxqError:
        raise
    except Exception as exc:
        raise explained(exc, operation, url, settings) from None


CHANGED = {"412", "PreconditionFailed"}


class ObjectChanged(StorageError):
    """The object was replaced while a job read it: its ETag is not the one it was opened with."""


def head(settings: StorageConfig, url: ObjectURL) -> tuple[int, str]:
    """The object's size in bytes and its ETag, from one HEAD request."""
    with _as_mxq(settings, "read", url):
        answer = client(settings).head_object(Bucket=url.bucket, Key=url.key)
    return int(answer["ContentLength"]), str(answer.get("ETag", ""))


READ_CHUNK_BYTES = 1 << 20  # a ranged GET's body is copied into its buffer this much at a time


def read_range(settings: StorageConfig, url: ObjectURL, start: int, stop: int,
               into: bytearray | None = None, etag: str | None = None) -> memoryview:
    """Bytes [start, stop) of the object, from one ranged GET, read a chunk at a time into `into`
    (reused by a reader: fresh buffers of megabytes, freed from several threads, fragment the
    heap and the worker's memory grows), else into a new buffer; the part of it filled. With
    `etag`, only of that version of the object (If-Match): ObjectChanged when it was replaced."""
    size = max(0, stop - start)
    data = into if into is not None and len(into) >= size else bytearray(size)
    view, done = memoryview(data), 0
    if not size:
        return view[:0]
    pinned = {"IfMatch": etag} if etag else {}
    with _as_mxq(settings, "read", url):
        try:
            body = client(settings).get_object(Bucket=url.bucket, Key=url.key,
                                               Range=f"bytes={start}-{stop - 1}", **pinned)["Body"]
        except Exception as exc:
            if _code(exc) in CHANGED:
                raise ObjectChanged(f"input {url} was replaced while the job read it (it was "
                                    f"opened as ETag {etag}): submit the job again to read the "
                                    "new object") from None
            raise
        while done < size and (chunk := body.read(min(READ_CHUNK_BYTES, size - done))):
            view[done:done + len(chunk)] = chunk
            done += len(chunk)
        body.close()
    return view[:done]


def get(settings: StorageConfig, url: ObjectURL, writer: str | None = None) -> bytes:
    """A small object whole (a part, an image), from one GET; with `writer`, only an object that
    mxq job created (ObjectTaken for another writer's)."""
    with _as_mxq(settings, "read", url):
        answer = client(settings).get_object(Bucket=url.bucket, Key=url.key)
        if writer is not None and answer.get("Metadata", {}).get(WRITER) != writer:
            answer["Body"].close()
            raise taken(url, writer)
        data: bytes = answer["Body"].read()
    return data


WRITER = "mxq-writer"  # the user metadata naming the mxq job that created an object it writes
TAKEN = CHANGED  # a conditional write (If-None-Match: *) refused: an object is at the key


class ObjectTaken(StorageError):
    """A job's write refused, or an object in its place found: another writer created it."""


def taken(url: ObjectURL, writer: str) -> ObjectTaken:
    return ObjectTaken(f"{url} was created by another writer, not mxq job {writer}: mxq never "
                       "replaces (or merges) an object it did not create; remove it, or give "
                       "another --output-to")


def writer_of(settings: StorageConfig, url: ObjectURL) -> str | None:
    """The mxq job whose write created the object (its `WRITER` metadata; "" for an object no
    mxq job wrote), or None when there is none."""
    try:
        answer = client(settings).head_object(Bucket=url.bucket, Key=url.key)
    except Exception as exc:
        if _code(exc) in MISSING:
            return None
        raise explained(exc, "read", url, settings) from None
    return str(answer.get("Metadata", {}).get(WRITER, ""))


def own(settings: StorageConfig, url: ObjectURL, writer: str) -> bool:
    """Whether `writer` created the object (False: there is none); ObjectTaken when another did."""
    found = writer_of(settings, url)
    if found is not None and found != writer:
        raise taken(url, writer)
    return found is not None


def owned(settings: StorageConfig, url: ObjectURL, keys: list[str], writer: str) -> list[str]:
    """Those of `keys` (in `url`'s bucket) that `writer` created, each checked by a HEAD: what a
    job may delete of what it listed (an object another writer put there stays)."""
    from concurrent.futures import ThreadPoolExecutor

    def mine(key: str) -> bool:
        return writer_of(settings, ObjectURL(url.bucket, key)) == writer

    if not keys:
        return []
    with ThreadPoolExecutor(min(8, len(keys))) as pool:
        return [key for key, ok in zip(keys, pool.map(mine, keys), strict=True) if ok]


def create(settings: StorageConfig, url: ObjectURL, data: bytes, writer: str) -> None:
    """One object written whole by a single PUT, only where there is none (If-None-Match: *),
    its metadata naming `writer`. An object already there is accepted only as `writer`'s own
    earlier write (a PUT whose answer was lost, retried); another writer's: ObjectTaken."""
    with _as_mxq(settings, "write", url):
        try:
            client(settings).put_object(Bucket=url.bucket, Key=url.key, Body=data, IfNoneMatch="*",
                                        Metadata={WRITER: writer})
        except Exception as exc:  # refused (412): fine only where the object is `writer`'s own
            if _code(exc) not in TAKEN or not own(settings, url, writer):  # (another's: `own`
                raise  # raises ObjectTaken; one gone again since is raised as it came)


UPLOAD_PART_BYTES = 8 << 20  # a multipart upload's part, at least (S3 allows 10,000 parts)
UPLOAD_THREADS = 8


def create_from(settings: StorageConfig, path: str, url: ObjectURL, writer: str) -> None:
    """A local file written as one object only where there is none, as `create` does: one PUT up
    to a part's size, else a multipart upload (parts sent by a few threads) completed with
    If-None-Match: * (the object appears whole when complete, or not at all)."""
    size = os.path.getsize(path)
    if size <= UPLOAD_PART_BYTES:
        with open(path, "rb") as f:
            create(settings, url, f.read(), writer)
        return
    s3 = client(settings)
    with _as_mxq(settings, "write", url):
        upload_id = s3.create_multipart_upload(Bucket=url.bucket, Key=url.key,
                                               Metadata={WRITER: writer})["UploadId"]
        try:
            parts = _upload_parts(s3, path, size, url, upload_id)
            s3.complete_multipart_upload(Bucket=url.bucket, Key=url.key, UploadId=upload_id,
                                         MultipartUpload={"Parts": parts}, IfNoneMatch="*")
        except Exception as exc:  # an object there is fine only as `writer`'s own (a complete
            with suppress(Exception):  # retried after its answer was lost); another's: ObjectTaken
                s3.abort_multipart_upload(Bucket=url.bucket, Key=url.key, UploadId=upload_id)
            if _code(exc) is None or not own(settings, url, writer):
                raise


def _upload_parts(s3: S3Client, path: str, size: int, url: ObjectURL, upload_id: str) -> list[UploadedPart]:
    """The file's parts sent, each read at its offset (os.pread) by one of a few threads."""
    from concurrent.futures import ThreadPoolExecutor

    step = max(UPLOAD_PART_BYTES, -(-size // 9_000))
    fd = os.open(path, os.O_RDONLY)

    def send(number: int) -> UploadedPart:
        body = os.pread(fd, step, (number - 1) * step)
        answer = s3.upload_part(Bucket=url.bucket, Key=url.key, UploadId=upload_id,
                                PartNumber=number, Body=body)
        return {"ETag": answer["ETag"], "PartNumber": number}

    try:
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            return list(pool.map(send, range(1, -(-size // step) + 1)))
    finally:
        os.close(fd)


def upload(settings: StorageConfig, path: str, url: ObjectURL) -> None:
    """A local file uploaded as one object (multipart past 8 MiB, by s3transfer): the object
    appears when its last part is in, never half."""
    with _as_mxq(settings, "write", url):
        client(settings).upload_file(path, url.bucket, url.key)


def download(settings: StorageConfig, url: ObjectURL, path: str) -> None:
    """An object saved as the local file `path` (by ranged parts, by s3transfer)."""
    with _as_mxq(settings, "read", url):
        client(settings).download_file(url.bucket, url.key, path)


UNBOUNDED = 2**62  # a listing of what mxq wrote itself (a job's parts) needs no bound


def listed(settings: StorageConfig, url: ObjectURL, most: int = UNBOUNDED) -> list[tuple[str, float, int]]:
    """(key, last modified as a POSIX time, size) of the objects whose key starts with `url`'s,
    at most `most` of them (StorageError past it: a listing of a user's prefix stays bounded)."""
    return _listing(settings, url, most, lambda o: (o["Key"], o["LastModified"].timestamp(), int(o["Size"])))


def versions(settings: StorageConfig, url: ObjectURL, most: int = UNBOUNDED) -> list[tuple[str, int, str]]:
    """(key, size, ETag) of the objects whose key starts with `url`'s, bounded as `listed`: the
    version of each that a reader then asks for (If-Match)."""
    return _listing(settings, url, most, lambda o: (o["Key"], int(o["Size"]), str(o.get("ETag", ""))))


def _listing(settings: StorageConfig, url: ObjectURL, most: int, row: Callable[[S3Answer], T]) -> list[T]:
    """`row` of each object listed (only what it keeps is held: a prefix may list a million)."""
    found: list[T] = []
    with _as_mxq(settings, "list", url):
        pages = client(settings).get_paginator("list_objects_v2").paginate(Bucket=url.bucket,
                                                                             Prefix=url.key)
        for page in pages:
            found += [row(o) for o in page.get("Contents", [])]
            if len(found) > most:
                raise StorageError(f"{url} holds more than {most:,} objects: narrow the prefix")
    return found


def delete(settings: StorageConfig, url: ObjectURL, keys: list[str]) -> None:
    """Remove `keys` of `url`'s bucket (a missing one is no error), a thousand per request."""
    with _as_mxq(settings, "delete", url):
        for i in range(0, len(keys), 1000):
            client(settings).delete_objects(Bucket=url.bucket, Delete={
                "Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def abort_uploads(settings: StorageConfig, url: ObjectURL) -> None:
    """Abort the unfinished multipart uploads of `url`'s key (a merge that died mid-upload
    leaves its parts billed and invisible)."""
    with _as_mxq(settings, "clean up", url):
        s3 = client(settings)
        for upload in s3.list_multipart_uploads(Bucket=url.bucket, Prefix=url.key).get("Uploads", []):
            if upload["Key"] == url.key:
                s3.abort_multipart_upload(Bucket=url.bucket, Key=url.key, UploadId=upload["UploadId"])
