"""An S3-compatible server on loopback for the benchmarks and the tests: moto's standalone server
(there is no cloud here; it stands in for S3 as the fake nvidia-smi stands in for a GPU), the
tests' one started on first use and shared by the session. Its credentials are made up each
time, so a test can grep for them."""

from __future__ import annotations

import os
import secrets
import socket
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, ClassVar

BUCKET = "mxq-tests"  # the bucket every stack of the session may read (MXQ_S3_ALLOWED)
ALLOWED = f"{BUCKET}/in"  # ... under this prefix only
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes]

    shared_one: ClassVar[S3Server | None] = None

    @classmethod
    def shared(cls) -> S3Server:
        """The session's server, started (and its bucket made) on first use."""
        if cls.shared_one is None:
            cls.shared_one = cls.start()
        return cls.shared_one

    @classmethod
    def start(cls) -> S3Server:
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        key = "AKIA" + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16))
        server = cls(f"http://127.0.0.1:{port}", key, secrets.token_urlsafe(30), proc)
        os.environ.update(server.credentials())  # this process's own boto3 (the tests, in-process CLI)
        deadline = time.monotonic() + 30
        while True:
            try:
                server.client().create_bucket(Bucket=BUCKET)
                return server
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def credentials(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": REGION}

    def env(self) -> dict[str, str]:
        """What a stack needs to read the session's bucket: the endpoint, the allowed prefix, and
        the credentials through the standard AWS variables."""
        return {"MXQ_S3_ENDPOINT_URL": self.endpoint, "MXQ_S3_ALLOWED": ALLOWED, **self.credentials()}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def put(self, key: str, data: bytes) -> str:
        """`data` stored as BUCKET/`key`; its s3:// URL."""
        self.client().put_object(Bucket=BUCKET, Key=key, Body=data)
        return f"s3://{BUCKET}/{key}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
