"""The session's S3-compatible server (moto's, on loopback): the benchmarks' own, shared."""

from bench.s3server import ALLOWED, BUCKET, S3Server

__all__ = ["ALLOWED", "BUCKET", "S3Server"]
