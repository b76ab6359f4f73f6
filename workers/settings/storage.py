"""Object storage's settings: the buckets jobs may read (MXQ_S3_ALLOWED), the bucket store of
model versions, the S3-compatible endpoint and how long each call may take. Credentials come
from the standard AWS chain, never from here."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from mxq.errors import UserError
from mxq.objects import Allowed, parse
from mxq.workers.settings.part import HOUR, Part

# Each call to the object store (a HEAD, a ranged GET, a PUT) gives up after about this long, its
# retries included: 3 tries of 15 s each. A frozen S3 server must not hang a submit or a job for
# minutes (60 s and 6 tries measured 6 minutes for a submit); a shorter bound fails sooner.
DEFAULT_S3_TIMEOUT_SECONDS = 45.0


class StorageFields(Part):
    s3_allowed: str | None = Field(
        None, description="Buckets and prefixes (comma-separated `bucket` or `bucket/prefix`) "
        "whose objects jobs may read as s3://bucket/key; unset = none. Credentials come from the "
        "standard AWS chain (environment, shared files, instance role), never from here.")
    s3_model_store: str | None = Field(
        None, description="s3://BUCKET/PREFIX that every registered version's files (symbol, "
        "params, ONNX export) are also uploaded to, so that a node without them (another host, "
        "no shared folder) fetches them once into its own $MXQ_HOME/models; unset = local only.")
    s3_endpoint_url: str | None = Field(
        None, description="Endpoint of an S3-compatible server (MinIO, Ceph, R2: "
        "http://HOST:9000); unset = AWS's own.")
    s3_timeout_seconds: float = Field(
        DEFAULT_S3_TIMEOUT_SECONDS, gt=0, le=HOUR,
        description="Longest each object-store call waits, its retries included (up to 3 tries "
        "of a third of it each, at most 5 s of each to connect); past it the call fails: a 503 "
        "from the API, exit 2 from the CLI, a retry of the job.")

    @field_validator("s3_allowed")
    @classmethod
    def _s3_allowed_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Allowed.parse(value)
            except UserError as e:
                raise ValueError(f"MXQ_S3_ALLOWED: {e}") from None
        return value

    @field_validator("s3_model_store")
    @classmethod
    def _s3_model_store(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            return str(parse(value, "MXQ_S3_MODEL_STORE")).rstrip("/")
        except UserError as e:
            raise ValueError(str(e)) from None

    @field_validator("s3_endpoint_url")
    @classmethod
    def _s3_endpoint(cls, value: str | None) -> str | None:
        """An endpoint is an http(s) URL without credentials: a key in it would reach logs."""
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("MXQ_S3_ENDPOINT_URL must be http://HOST[:PORT] or https://HOST[:PORT]")
        if parts.username or parts.password:
            raise ValueError("MXQ_S3_ENDPOINT_URL must not hold credentials: the standard AWS "
                             "chain gives them (AWS_ACCESS_KEY_ID, ~/.aws/credentials, a role)")
        return value

    @property
    def s3_allowed_prefixes(self) -> Allowed:
        return Allowed.parse(self.s3_allowed)

    @property
    def storage(self) -> StorageSettings:
        """What object storage needs of the settings, and nothing else."""
        return StorageSettings(self.s3_allowed_prefixes, self.s3_model_store, self.s3_endpoint_url,
                               self.s3_timeout_seconds)


@dataclass(frozen=True)
class StorageSettings:
    """Object storage's settings, parsed: the buckets and prefixes jobs may read, the model
    versions' bucket store (s3://BUCKET/PREFIX or None), the endpoint (None: AWS's own), and the
    bound of each call."""

    allowed: Allowed
    model_store: str | None
    endpoint_url: str | None
    timeout_seconds: float
