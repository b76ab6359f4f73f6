"""The inference case from a bucket: the same `mxq infer` job over the same `.npy` input, from a
local file and from an S3-compatible server on loopback (moto's), same run, alternating.

Prints the throughput ratio (S3 over local) and the worker's peak memory after the local jobs
and after the S3 ones: ranged reads with a bounded read-ahead should cost no memory.

    python -m bench.object_storage [--samples 200000]

The S3-compatible server is moto's standalone one on loopback (there is no cloud here; it stands
in for S3 as the fake nvidia-smi stands in for a GPU); the tests share one per session
(`S3Server.shared`). Its credentials are made up each time, so a test can grep for them.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import statistics
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from bench.infer_overhead import MODEL, make_input, register, warm
from bench.stack import free_port, peak_rss_mib, rate, running_stack, wait_job, worker_pids

BUCKET = "mxq-tests"  # the bucket every stack of the session may read (MXQ_S3_ALLOWED)
ALLOWED = f"{BUCKET}/in"  # ... under this prefix only
REGION = "us-east-1"


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
        port = free_port()
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

    @cached_property
    def _client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def client(self) -> Any:
        """A boto3 client of the server, made once."""
        return self._client

    def put(self, key: str, data: bytes) -> str:
        """`data` stored as BUCKET/`key`; its s3:// URL."""
        self.client().put_object(Bucket=BUCKET, Key=key, Body=data)
        return f"s3://{BUCKET}/{key}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _timed(s: Any, source: str, batch: int) -> float:
    from mxq.workers.jobs.submit import submit

    return rate(wait_job(s, submit(s, "infer", {"model": MODEL, "input": source, "batch_size": batch},
                                   "cpu:0")))


def run(samples: int = 200_000, arch: str = "lenet", shape: tuple[int, ...] = (1, 28, 28),
        batch: int = 256, rounds: int = 3, root: Path | None = None) -> dict[str, Any]:
    server = S3Server.start()
    try:
        with running_stack(cpu_devices=1, root=root, prefix="objects-", env=server.env()) as s:
            register(s, arch, shape)
            path = make_input(s.home_path / "input.npy", samples, shape)
            server.client().upload_file(str(path), BUCKET, "in/input.npy")
            url = f"s3://{BUCKET}/in/input.npy"
            warm(s, shape, batch, ["cpu:0"])
            # The worker's first S3 job imports boto3 and makes its client (tens of MiB, once):
            # a small object first, so the figures compare reading, not importing.
            small = make_input(s.home_path / "warm-s3.npy", batch, shape, seed=1)
            server.client().upload_file(str(small), BUCKET, "in/warm.npy")
            _timed(s, f"s3://{BUCKET}/in/warm.npy", batch)
            pid = worker_pids(s)["cpu:0"]
            local, remote = [_timed(s, str(path), batch)], []
            peak_local = peak_rss_mib(pid)  # before any object was read
            remote.append(_timed(s, url, batch))
            for _ in range(rounds - 1):
                local.append(_timed(s, str(path), batch))
                remote.append(_timed(s, url, batch))
            peak_remote = peak_rss_mib(pid)
    finally:
        server.stop()
    result = {"samples": samples, "arch": arch, "shape": list(shape), "batch_size": batch,
              "input_mib": path_mib(samples, shape), "local_runs": local, "s3_runs": remote,
              "local": statistics.median(local), "s3": statistics.median(remote),
              "ratio": statistics.median(remote) / statistics.median(local),
              "peak_rss_local_mib": peak_local, "peak_rss_s3_mib": peak_remote,
              "memory_ratio": peak_remote / peak_local}
    print(f"  {arch} {tuple(shape)}, {samples:,} samples ({result['input_mib']:,.0f} MiB), batch {batch}")
    print(f"  local .npy  {result['local']:12,.0f} samples/s")
    print(f"  s3:// .npy  {result['s3']:12,.0f} samples/s  ratio {result['ratio']:.3f}")
    print(f"  worker peak RSS {peak_local:,.0f} MiB after the local job, {peak_remote:,.0f} MiB "
          f"after the S3 ones; ratio {result['memory_ratio']:.3f}")
    return result


def path_mib(samples: int, shape: tuple[int, ...]) -> float:
    return samples * math.prod(shape) * 4 / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    run(ap.parse_args().samples)


if __name__ == "__main__":
    main()
