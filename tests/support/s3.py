"""The session's S3-compatible server (moto's, on loopback): the benchmarks' own, shared."""

from bench.object_storage import ALLOWED, BUCKET, S3Server

__all__ = ["ALLOWED", "BUCKET", "S3Server"]
