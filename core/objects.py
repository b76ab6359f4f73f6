"""Object-storage locations (`s3://bucket/key`): parsed and checked once where a user gives one,
and confined to the buckets and prefixes a setting allows, as paths are confined to the data root.
Pure rules: the client that reads them is `mxq.workers.storage`.

S3 does not resolve `..` in a key, but an S3-compatible server or a proxy in front of one may:
a key with an empty, `.` or `..` segment is refused, so that a prefix check on the key's text is
the same check the server makes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxq.errors import UserError

SCHEME = "s3://"
# S3's rules for a bucket name (3-63 characters of lowercase letters, digits, dots and hyphens,
# starting and ending with a letter or digit), which every S3-compatible server accepts.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
MAX_KEY_BYTES = 1024  # S3's limit on a key's UTF-8 length


class ObjectURLError(UserError):
    """An `s3://` location that is malformed, or outside the allowed buckets and prefixes."""


@dataclass(frozen=True)
class ObjectURL:
    """A checked `s3://bucket/key` (the key may end in `/` for a prefix)."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    @property
    def suffix(self) -> str:
        """The key's suffix, lowercase (".npy"), as a path's: it names the format."""
        name = self.key.rsplit("/", 1)[-1]
        return "." + name.rsplit(".", 1)[1].lower() if "." in name.strip(".") else ""


def is_object_url(text: str) -> bool:
    return text.startswith(SCHEME)


def parse(text: str, what: str = "input") -> ObjectURL:
    """`text` as an ObjectURL, or a one-line ObjectURLError saying what is wrong with it."""
    if not is_object_url(text):
        raise ObjectURLError(f"{what} {text[:80]!r} is not an s3://bucket/key location")
    bucket, _, key = text[len(SCHEME):].partition("/")
    shown = text[:120]
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ObjectURLError(f"{what} {shown!r} names the bucket {bucket[:64]!r}: a bucket name is 3 "
                             "to 63 lowercase letters, digits, dots and hyphens")
    if not key:
        raise ObjectURLError(f"{what} {shown!r} names no key: use s3://{bucket}/KEY")
    if len(key.encode()) > MAX_KEY_BYTES or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ObjectURLError(f"{what} {shown!r} has a key of over {MAX_KEY_BYTES} bytes or with "
                             "control characters")
    if any(part in ("", ".", "..") for part in key.rstrip("/").split("/")):
        raise ObjectURLError(f"{what} {shown!r} has an empty, '.' or '..' segment in its key")
    return ObjectURL(bucket, key)


@dataclass(frozen=True)
class Allowed:
    """Where objects may be read and written: `bucket` (all of it) or `bucket/prefix` (the
    prefix as a folder: `data/team-a` allows `team-a/x.npy`, not `team-ab/x.npy`)."""

    entries: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> Allowed:
        """From a setting's comma-separated list; a malformed entry is a one-line error."""
        entries = []
        for item in (text or "").split(","):
            if not (item := item.strip()):
                continue
            bucket, _, prefix = item.removeprefix(SCHEME).partition("/")
            if not _BUCKET.fullmatch(bucket):
                raise ObjectURLError(f"allowed bucket {item[:80]!r} is not a bucket name (3 to 63 "
                                     "lowercase letters, digits, dots and hyphens)")
            prefix = prefix.strip("/")
            if prefix and any(part in (".", "..") or not part for part in prefix.split("/")):
                raise ObjectURLError(f"allowed prefix {item[:80]!r} has an empty, '.' or '..' segment")
            entries.append((bucket, prefix))
        return cls(tuple(entries))

    def admits(self, url: ObjectURL) -> bool:
        return any(url.bucket == bucket and (not prefix or url.key == prefix
                                             or url.key.startswith(prefix + "/"))
                   for bucket, prefix in self.entries)

    def __str__(self) -> str:
        return ", ".join(f"{b}/{p}" if p else b for b, p in self.entries) or "none"


def confined(text: str, allowed: Allowed, setting: str, what: str = "input") -> ObjectURL:
    """`text` parsed, if `allowed` admits it; else an error naming it and the setting."""
    url = parse(text, what)
    if not allowed.admits(url):
        raise ObjectURLError(f"{what} {url} is outside the allowed buckets and prefixes "
                             f"({setting}: {allowed})")
    return url


def job_output(prefix: str, stack: str, job_id: int, suffix: str = ".parquet") -> ObjectURL:
    """The object a job's output (`.parquet` or `.npy`) becomes under the bucket prefix it was
    given: `PREFIX/STACK/job-ID.parquet`, keyed by the stack's id as local outputs are, so two
    stacks allowed the same prefix never write one object (each has its job 2)."""
    url = parse(prefix, "output_to")
    return ObjectURL(url.bucket, f"{url.key.rstrip('/')}/{stack}/job-{job_id}{suffix}")


# A key segment that is a job's output or its parts' folder: no output prefix may lie inside one.
_JOB_SEGMENT = re.compile(r"^job-\d+\.(parquet|npy)(\.parts)?$")


def check_output_prefix(url: ObjectURL) -> ObjectURL:
    """An output prefix that lies inside no job's output or parts (`…/job-48.parquet.parts/`):
    a job there would have its objects listed and deleted as the other job's parts."""
    inside = [s for s in url.key.split("/") if _JOB_SEGMENT.match(s) or s.endswith(".parts")]
    if inside:
        raise ObjectURLError(f"output_to {url} lies inside {inside[0]!r}, another job's output or "
                             "parts: give a prefix of your own")
    return url
