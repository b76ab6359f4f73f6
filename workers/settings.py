"""All of mxq's settings, read once from `MXQ_*` environment variables.

Every default is a named value here with a line saying why, so there is one place to look.
Read at the edges (a worker's, a training child's or the API's start, the CLI) and passed in:
the modules that read `os.environ` besides this one start processes with it or are the start of
one (tests/house/test_settings_edges.py lists them).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mxq.errors import UserError
from mxq.objects import Allowed, parse
from mxq.workers.stack_record import STACK_RECORD, recorded_data_root, with_recorded_stack, without_password

# Long enough for the longest training job: Redis hands an unacknowledged message to another
# worker after this many seconds, so a shorter value would run long jobs twice.
DEFAULT_VISIBILITY_TIMEOUT = 12 * 3600
# Workers write a heartbeat this often; a device whose last one is older than
# HEARTBEAT_TTL_FACTOR times this is taken for dead.
DEFAULT_HEARTBEAT_SECONDS = 2.0
HEARTBEAT_TTL_FACTOR = 5
# A job whose worker dies this many times is failed rather than retried forever.
DEFAULT_MAX_ATTEMPTS = 3
# The shortest API token accepted: an empty or guessable one must not open the API.
MIN_TOKEN_CHARS = 16
# Schedules fire at minute granularity; a tick every 15 s keeps them within a quarter minute.
DEFAULT_TICK_SECONDS = 15.0
# The reconciler (in the schedule process) compares SQL with the broker this often.
DEFAULT_RECONCILE_SECONDS = 30.0
# The reconciler looks at the broker twice this far apart before it calls a message lost.
DEFAULT_RECONCILE_LOOK_SECONDS = 1.0
# Dynamic batching: a worker running a small inference job (at most this many samples) also takes
# queued small jobs of the same model, up to DEFAULT_MERGE_SAMPLES samples in one batch, waiting
# at most DEFAULT_BATCH_WAIT_MS for more to arrive.
DEFAULT_SMALL_JOB_SAMPLES = 64
DEFAULT_MERGE_SAMPLES = 1024
DEFAULT_BATCH_WAIT_MS = 5.0
# Two CPU "devices" let data-parallel code and routing run on any laptop.
DEFAULT_CPU_DEVICES = 2
# Each CPU device is a worker process pinned to its own cores: more devices than cores only
# plans processes that fight for them. MXQ_MAX_CPU_DEVICES raises the bound, never past this.
MAX_CPU_DEVICES = 1024
# A probe (environment check) may do at most this much work (matrix multiply and convolution,
# warm-up rounds included): about 4 s of multiply on a 2-core CPU at 24 GFLOP/s, about 15 s if
# all of it were convolution at 7 GFLOP/s, milliseconds on a GPU. The default probe is 14 GFLOP.
DEFAULT_MAX_PROBE_GFLOP = 100
# Inputs are memory-mapped a batch at a time, so this only stops a wrong path (a disk image, a
# dump) from tying up a device for hours; raise it for genuinely larger inputs.
DEFAULT_MAX_INPUT_BYTES = 64 * 2**30
DEFAULT_JOB_LOG_BYTES = 256 * 2**10
# Largest image, in pixels, judged from its header before decoding (an 8K frame is 33 million).
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000
# A running job with no progress for this long is failed (its worker still beating: a read that
# blocks for good); a cancel not heeded this long is enforced.
DEFAULT_STALL_SECONDS = 3600.0
DEFAULT_CANCEL_GRACE_SECONDS = 120.0
# A schedule's dataset glob stops past this many folder entries, or this many seconds.
DEFAULT_GLOB_MAX_ENTRIES = 100_000
DEFAULT_GLOB_SECONDS = 10.0
# A batch this large already fills a big GPU with a small model; more is almost surely a typo.
DEFAULT_MAX_BATCH_SIZE = 65536
# Training longer than this many epochs is a typo (an extra zero), not a plan.
DEFAULT_MAX_EPOCHS = 10000
# Job and schedule requests are a few hundred bytes of JSON; 1 MiB leaves room for long lists
# while a client cannot make the API buffer gigabytes.
DEFAULT_MAX_BODY_BYTES = 2**20
# A multi-node training whose nodes have not all joined after this long fails: one node's
# device may be busy with a long job, or the node is down. The started nodes wait idle till then.
DEFAULT_DIST_START_SECONDS = 300.0
# The limited broadcast address: it names no host, so no node can be reached at it.
BROADCAST = ipaddress.IPv4Address("255.255.255.255")
# A user's submit waits this long for each broker call (the reachability check, the publish): a
# hung Redis (paused, a frozen VM) must not hang `mxq infer` or `POST /api/v1/jobs`. A job whose
# message is not out by then stays queued and the reconciler publishes it.
DEFAULT_BROKER_TIMEOUT_SECONDS = 5.0
# Each call to the object store (a HEAD, a ranged GET, a PUT) gives up after about this long, its
# retries included: 3 tries of 15 s each. A frozen S3 server must not hang a submit or a job for
# minutes (60 s and 6 tries measured 6 minutes for a submit); a shorter bound fails sooner.
DEFAULT_S3_TIMEOUT_SECONDS = 45.0
# A webhook's POST gives up when a phase (connect, send, each read of the answer) takes longer:
# a slow or hung endpoint holds one of the sender's threads this long, never a job or a request.
DEFAULT_HOOK_TIMEOUT_SECONDS = 10.0

# Upper bounds of the numeric settings: each far above any sensible value, so only a typo or a
# hostile value (inf, 1e308, a 400-digit count) meets them, before any timer or sum overflows.
HOUR, DAY = 3600.0, 86400.0
MAX_COUNT = 2**31 - 1  # what every SQL integer column and C int holds

# The URL schemes mxq runs with: SQLite and PostgreSQL (psycopg 3) for the database; Redis over
# TCP, TLS or the embedded unix socket for the broker.
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgres")
BROKER_SCHEMES = ("redis", "rediss", "redis+socket")
# Linux's sun_path holds 108 bytes with the closing NUL: a longer socket path is cut short.
MAX_SOCKET_PATH = 107
FALLBACK_SOCKET_ROOT = "/tmp"  # the last short folder tried for the socket


class Settings(BaseSettings):
    """mxq configuration; `MXQ_<FIELD>` sets each field."""

    model_config = SettingsConfigDict(env_prefix="MXQ_", extra="ignore", allow_inf_nan=False)

    home: Path = Field(Path("var"), description="State folder: embedded Redis, SQLite, logs, pids.")
    broker_url: str | None = Field(None, description="Redis URL; unset = embedded Redis.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; unset = SQLite in home.")
    node: str = Field(
        default_factory=lambda: socket.gethostname().split(".")[0], description="This machine's name."
    )
    cpu_devices: int = Field(DEFAULT_CPU_DEVICES, description="CPU devices on a GPU-less host: "
                             "at most the cores this process may use (or 2), or MXQ_MAX_CPU_DEVICES.")
    max_cpu_devices: int | None = Field(
        None, ge=1, le=MAX_CPU_DEVICES, description="Allow MXQ_CPU_DEVICES up to this many "
        "(unset: the cores this process may use, at least 2).")
    data_root: Path | None = Field(
        None, description="Job inputs must lie inside this folder. Unset: your home folder, or "
        "$MXQ_HOME/data when the API listens beyond loopback. `mxq up` records the one it starts "
        "with in $MXQ_HOME/stack.json, and every process of the stack uses that one.")
    nvidia_smi: str = Field("nvidia-smi", description="The nvidia-smi program to query GPUs.")
    expect_gpus: bool = Field(False, description="Fail instead of starting CPU devices when "
                              "nvidia-smi fails (also the case wherever /dev/nvidia0 exists).")
    worker_memory_mb: int | None = Field(
        None, ge=1, le=2**24, description="Host memory cap (RLIMIT_DATA, MiB) of each device worker; unset = "
        "no cap. A batch that does not fit fails with out-of-memory and is retried halved."
    )
    visibility_timeout: int = Field(DEFAULT_VISIBILITY_TIMEOUT, ge=60, le=int(30 * DAY))
    heartbeat_seconds: float = Field(DEFAULT_HEARTBEAT_SECONDS, gt=0, le=HOUR)
    max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1, le=100)
    reprobe_seconds: float = Field(60.0, gt=0, le=HOUR, description="A device whose worker refused it "
                                   "or whose device failed mid-job is probed again (its worker started, "
                                   "its start check run) after this long, twice as long after each "
                                   "refusal in a row, up to 30 minutes.")
    tick_seconds: float = Field(DEFAULT_TICK_SECONDS, gt=0, le=DAY, description="Schedule tick period.")
    # The cadences a running stack waits on. The defaults are what a fleet should pay (each is a
    # statement per running job or a sleep per deferral); tests run their stacks at a fraction.
    cancel_check_seconds: float = Field(2.0, gt=0, le=HOUR, description="How often a running job "
                                        "looks for a cancel request (a statement per running job).")
    progress_seconds: float = Field(2.0, gt=0, le=HOUR, description="How often a running job "
                                    "writes its progress (a statement per running job).")
    defer_seconds: float = Field(1.0, gt=0, le=HOUR, description="How long a message a worker "
                                 "cannot take now waits before it goes back to its queue.")
    hook_seconds: float = Field(5.0, gt=0, le=HOUR, description="How often the schedule process "
                                "sends the due webhook deliveries.")
    model_trial_seconds: float = Field(120.0, gt=0, le=HOUR, description="Longest the trial run "
                                       "of a plain ONNX file being registered may take, per batch.")
    reconcile_seconds: float = Field(DEFAULT_RECONCILE_SECONDS, gt=0, le=DAY,
                                     description="How often the reconciler runs.")
    keep_output_days: int | None = Field(
        None, ge=1, le=36500, description="Remove the outputs (files in this home, SQL rows) of "
        "inference jobs finished more than this many days ago, except pinned ones (`mxq pin`); "
        "unset = keep every output.")
    keep_versions: int | None = Field(
        None, ge=1, le=10000, description="Keep each model's newest this many versions; remove "
        "the files of older unpromoted ones (never a promoted one, nor one a queued or running "
        "job names); unset = keep every version.")
    reconcile_look_seconds: float = Field(
        DEFAULT_RECONCILE_LOOK_SECONDS, gt=0, le=60,
        description="Seconds between the reconciler's two looks at the broker."
    )
    dynamic_batching: bool = Field(True, description="Merge small inference jobs of one model.")
    quota_borrowing: bool = Field(False, description="Let a job beyond its owner's quota borrow a "
                                  "device no one else's job waits for; preemptible, taken back first.")
    small_job_samples: int = Field(DEFAULT_SMALL_JOB_SAMPLES, ge=1, le=2**24)
    merge_samples: int = Field(DEFAULT_MERGE_SAMPLES, ge=1, le=2**24)
    batch_wait_ms: float = Field(DEFAULT_BATCH_WAIT_MS, ge=0, le=60_000)
    host_gpus: str | None = Field(
        None, description="Host indexes of the GPUs this process sees, in order (e.g. '1' in a "
        "container given only host GPU 1), so devices keep their host names."
    )
    cuda_visible_devices: str | None = Field(
        None, validation_alias="CUDA_VISIBLE_DEVICES", max_length=4096,
        description="CUDA's own variable, read by the launcher: the GPUs (nvidia-smi indexes or "
        "UUIDs, comma-separated, in order) mxq may use on this host; empty or -1: none (CPU "
        "devices). Each worker still gets its one GPU in its own CUDA_VISIBLE_DEVICES.")
    onnx_python: str | None = Field(
        None, max_length=4096,
        description="Python of a second environment holding the gpu-onnx extra (a host with GPUs "
        "MXNet cannot run beside GPUs it runs): the launcher starts the former's workers with it. "
        "Unset: this environment's own, when it has ONNX Runtime for GPUs.")
    mxnet_build: str | None = Field(
        None, description="MXNet build to assume (e.g. mxnet-cu112); default: the installed one."
    )
    api_host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    api_port: int = Field(8470, ge=1, le=65535)
    api_hosts: str | None = Field(None, description="More names (comma-separated) the API serves "
                                  "as Host, beside loopback and MXQ_API_HOST.")
    api_token: SecretStr | None = Field(None, description="The token of the user `admin` (the "
                                        "API's first token, before users had their own).")
    metrics_token: SecretStr | None = Field(None, description="Bearer token Prometheus sends to "
                                            "scrape /metrics (besides an admin's token).")
    max_input_bytes: int = Field(DEFAULT_MAX_INPUT_BYTES, ge=1, le=2**50,
                                 description="Largest inference input (file or folder) accepted.")
    job_log_bytes: int = Field(DEFAULT_JOB_LOG_BYTES, ge=16 * 2**10, le=2**30,
                               description="Most a job's log keeps in SQL (its first and latest "
                               "lines; a note says how many between were dropped).")
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
    hook_allowed_hosts: str | None = Field(
        None, description="Hosts webhook endpoints may be at (comma-separated: `hooks.example.com`, "
        "`*.example.com` for its subdomains, an IP address or network such as `10.0.0.0/8`); unset "
        "or empty = no webhook may be added or sent. A name must resolve to public addresses only, "
        "unless an address or network listed here holds each of its addresses: private, loopback "
        "and link-local addresses are reached only when named so.")
    hook_timeout_seconds: float = Field(
        DEFAULT_HOOK_TIMEOUT_SECONDS, gt=0, le=300,
        description="Longest a webhook attempt takes in all, from connecting to the answer's "
        "status line; past it the attempt failed and is retried later.")
    stall_seconds: float = Field(DEFAULT_STALL_SECONDS, gt=0, le=30 * DAY, description="A running job that "
                                 "reports no progress this long is failed by the reconciler.")
    cancel_grace_seconds: float = Field(DEFAULT_CANCEL_GRACE_SECONDS, gt=0, le=DAY, description="A running "
                                        "job that has not stopped this long after its cancel is "
                                        "cancelled by the reconciler; a worker whose job was taken "
                                        "from it this long ago and is still in it exits.")
    glob_max_entries: int = Field(DEFAULT_GLOB_MAX_ENTRIES, ge=1, le=10**9, description="Most folder "
                                  "entries a schedule's dataset glob may look at.")
    glob_seconds: float = Field(DEFAULT_GLOB_SECONDS, gt=0, le=HOUR, description="Longest a schedule's "
                                "dataset glob may search, in seconds.")
    max_image_pixels: int = Field(DEFAULT_MAX_IMAGE_PIXELS, ge=1, le=2**34,
                                  description="Largest image (width x height) an input may hold.")
    max_batch_size: int = Field(DEFAULT_MAX_BATCH_SIZE, ge=1, le=2**24, description="Largest batch size.")
    max_epochs: int = Field(DEFAULT_MAX_EPOCHS, ge=1, le=10**6, description="Most epochs a training may ask.")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1, le=2**30,
                                description="Largest HTTP API request body, in bytes.")
    node_address: str | None = Field(
        None, description="IPv4 address of this host that other nodes reach it at (multi-node "
        "training: the ps-lite scheduler, server and workers bind it and announce it, so it must "
        "be this host's own: in a container, use host networking); unset or empty = the address "
        "of the interface the default route uses, else 127.0.0.1."
    )
    dist_start_seconds: float = Field(DEFAULT_DIST_START_SECONDS, gt=0, le=DAY,
                                      description="How long a multi-node training waits for all "
                                      "its nodes to join before it fails.")
    broker_timeout_seconds: float = Field(
        DEFAULT_BROKER_TIMEOUT_SECONDS, gt=0, le=300,
        description="Longest a submit waits for each broker call; past it the job stays queued, "
        "the answer says it is not published yet, and the reconciler publishes it.")
    max_probe_gflop: int = Field(DEFAULT_MAX_PROBE_GFLOP, ge=1, le=10**7,
                                 description="Most work (GFLOP, warm-up included) one probe job "
                                 "may ask: size, batch and repeat beyond it are refused at submit.")
    # Set by the launcher for each worker process it starts, never by hand.
    device: str | None = Field(None, description="The device a worker process is pinned to.")
    device_model: str | None = Field(None, description="Its GPU's model (name and compute "
                                     "capability): engine and precision figures are kept per model.")
    mxnet_unusable: str | None = Field(
        None, description="Why MXNet cannot run this worker's GPU (set by the launcher): the worker "
        "serves inference with ONNX Runtime only and refuses training.")

    @field_validator("cpu_devices")
    @classmethod
    def _at_least_one_cpu(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"MXQ_CPU_DEVICES must be at least 1 (got {value}): "
                "a host without GPUs needs at least one CPU device to run jobs"
            )
        return value

    @model_validator(mode="after")
    def _cpu_devices_fit_the_machine(self) -> Settings:
        """Each CPU device is a worker process pinned to its own cores: 10,000 of them on two
        cores would only fight for them (and exhaust the process table)."""
        limit = self.max_cpu_devices or max(usable_cores(), DEFAULT_CPU_DEVICES)
        if self.cpu_devices > limit:
            origin = ("MXQ_MAX_CPU_DEVICES" if self.max_cpu_devices else
                      f"this machine's {usable_cores()} usable cores; set MXQ_MAX_CPU_DEVICES "
                      f"(at most {MAX_CPU_DEVICES}) to plan more")
            raise ValueError(f"MXQ_CPU_DEVICES={self.cpu_devices}: at most {limit} ({origin})")
        return self

    @field_validator("database_url")
    @classmethod
    def _database_scheme(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value, "MXQ_DATABASE_URL", DATABASE_SCHEMES,
                                                     "sqlite:///PATH or postgresql://USER@HOST/DB")

    @field_validator("broker_url")
    @classmethod
    def _broker_scheme(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value, "MXQ_BROKER_URL", BROKER_SCHEMES,
                                                     "redis://HOST:6379/0; unset it for the "
                                                     "embedded Redis")

    @field_validator("home")
    @classmethod
    def _home_is_a_folder(cls, value: Path) -> Path:
        """A home that names a file (a typo, a path swapped with a file's) would fail at the first
        folder made in it, with a traceback: refused here, in one line."""
        if value.exists() and not value.is_dir():
            raise ValueError("it is a file, not a folder: name a folder (made when missing)")
        return value

    @model_validator(mode="after")
    def _home_has_a_socket(self) -> Settings:
        """The embedded Redis's socket must fit sun_path: refused here, before anything starts,
        when neither the home nor a short fallback folder can hold it (`redis_socket_path`)."""
        sock = redis_socket_path(self.home)
        if self.broker_url is None and len(os.fsencode(sock)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"MXQ_HOME={self.home_path}: the embedded Redis socket path would exceed "
                f"{MAX_SOCKET_PATH} bytes and no short folder ($XDG_RUNTIME_DIR, the temp folder) "
                "fits it; use a shorter MXQ_HOME or set MXQ_BROKER_URL")
        return self

    @field_validator("s3_allowed")
    @classmethod
    def _s3_allowed_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Allowed.parse(value)
            except UserError as e:
                raise ValueError(f"MXQ_S3_ALLOWED: {e}") from None
        return value

    @field_validator("hook_allowed_hosts")
    @classmethod
    def _hook_allowed_hosts_parse(cls, value: str | None) -> str | None:
        if value is not None:
            HookAllowlist.parse(value)
        return value

    @property
    def hook_allowlist(self) -> HookAllowlist:
        return HookAllowlist.parse(self.hook_allowed_hosts)

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

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _empty_metrics_token_is_none(cls, value: object) -> object:
        """An empty MXQ_METRICS_TOKEN (compose passes it through, empty when the operator set
        none) is no token: /metrics then answers admins only."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_token", "metrics_token")
    @classmethod
    def _token_is_long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """A set token that is empty or short would open the API beyond loopback to anyone who
        guesses it: refused, so no process starts with it (unset means no token, loopback only)."""
        if value is not None and len(value.get_secret_value().strip()) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"MXQ_{str(info.field_name).upper()} has {len(value.get_secret_value().strip())} "
                f"characters; at least "
                f"{MIN_TOKEN_CHARS} are needed (e.g. `openssl rand -hex 24`), or leave it unset to "
                "serve on loopback only, where writes need no token"
            )
        return value

    @field_validator("node")
    @classmethod
    def _node_is_queue_safe(cls, value: str) -> str:
        if not value or any(c in value for c in " .:/@"):
            raise ValueError(
                f"MXQ_NODE {value!r} is not a usable node name: it must be non-empty "
                "and contain none of ' .:/@' (it becomes part of queue and worker names)"
            )
        return value

    @field_validator("node_address")
    @classmethod
    def _node_address_is_ipv4(cls, value: str | None) -> str | None:
        """ps-lite (MXNet 1.9.1) hands this address to ZeroMQ both to bind and to announce, and
        ZeroMQ binds only a numeric IPv4 address there: a host name or an IPv6 address would fail
        in ps-lite at the first multi-node training ("bind failed"), so it is refused at start."""
        if not value:
            return None  # unset (compose's `${VAR:-}`): the default route's address
        try:
            address = ipaddress.IPv4Address(value)
        except ValueError:
            address = None
        if address is None or address.is_unspecified or address.is_multicast or address == BROADCAST:
            raise ValueError("not a unicast IPv4 address; allowed: an IPv4 address of this host "
                             "that the other nodes reach, such as 10.0.0.7 (ps-lite binds the "
                             "address it announces: no host name, IPv6, 0.0.0.0 or multicast)")
        return value

    @field_validator("host_gpus")
    @classmethod
    def _host_gpus_are_indexes(cls, value: str | None) -> str | None:
        if value is not None and not all(p.strip().isdigit() for p in value.split(",")):
            raise ValueError(f"MXQ_HOST_GPUS {value!r} must be comma-separated GPU indexes, "
                             "such as 1 or 0,2")
        return value

    @property
    def host_gpu_ids(self) -> list[int] | None:
        return [int(p) for p in self.host_gpus.split(",")] if self.host_gpus else None

    @property
    def home_path(self) -> Path:
        return self.home.resolve()

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url is None

    @property
    def redis_socket(self) -> Path:
        return redis_socket_path(self.home_path)

    @property
    def broker(self) -> str:
        return self.broker_url or f"redis+socket://{self.redis_socket}"

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.home_path / 'mxq.db'}"

    @property
    def address(self) -> str:
        """MXQ_NODE_ADDRESS, else the address of the interface with the default route (under
        host networking, the host's own)."""
        if self.node_address:
            return self.node_address
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect(("192.0.2.1", 9))  # UDP connect sends nothing: it picks a route
                return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"

    @property
    def own_data_root(self) -> Path:
        """This process's own MXQ_DATA_ROOT, or the default (see `data_root`)."""
        if self.data_root is not None:
            return self.data_root.expanduser().resolve()
        return Path.home().resolve() if self.api_on_loopback else self.home_path / "data"

    @property
    def api_on_loopback(self) -> bool:
        """The API listens on this machine only (127.0.0.0/8, ::1, localhost)."""
        return is_loopback(self.api_host)

    @property
    def inputs_root(self) -> Path:
        """The folder inputs must lie in: the one the stack recorded at `mxq up`, else our own."""
        return self.inputs_root_and_origin()[0]

    def inputs_root_and_origin(self) -> tuple[Path, str]:
        """`inputs_root`, and where it comes from and how to change it (for error messages),
        from one look at the stack's record."""
        recorded = recorded_data_root(self.home_path)
        if recorded is not None:
            return recorded, (f"the stack's, recorded by `mxq up` in {self.home_path / STACK_RECORD}; "
                              "restart the stack with MXQ_DATA_ROOT=FOLDER to change it")
        origin = "MXQ_DATA_ROOT" if self.data_root is not None else "the default; set MXQ_DATA_ROOT"
        return self.own_data_root, origin

    @property
    def heartbeat_ttl(self) -> float:
        return self.heartbeat_seconds * HEARTBEAT_TTL_FACTOR


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as a container or taskset limits
    it), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _check_url(value: str, env: str, schemes: tuple[str, ...], example: str) -> str:
    """`value` if it is SCHEME://… with a scheme mxq runs with, else the one-line reason
    (naming the URL without its password)."""
    shown = without_password(value)[0] if "://" in value else value
    scheme = value.split("://", 1)[0].lower() if "://" in value else None
    if scheme is None or scheme not in schemes:
        what = f"scheme {scheme!r} is not supported" if scheme else "not a URL"
        raise ValueError(f"{env}={shown}: {what}; allowed schemes: {', '.join(schemes)} "
                         f"(e.g. {example})")
    try:
        urlsplit(value).port  # noqa: B018  # a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"{env}={shown}: {exc} (e.g. {example})") from None
    return value


def redis_socket_path(home: Path) -> Path:
    """Where the embedded Redis of `home` listens: `home/redis.sock` when that fits sun_path
    (107 bytes), else `redis.sock` in a folder named by a hash of the home under
    $XDG_RUNTIME_DIR or the temp folder (one per home, the same for every process). Every
    process that reaches the embedded Redis asks here. Where nothing fits, the shortest (too
    long) path: Settings refuses such a home in one line before anything starts."""
    home = home.expanduser().resolve()
    own = home / "redis.sock"
    if len(os.fsencode(own)) <= MAX_SOCKET_PATH:
        return own
    name = "mxq-" + hashlib.sha256(os.fsencode(home)).hexdigest()[:16]
    roots = (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), FALLBACK_SOCKET_ROOT)
    shorts = [Path(r) / name / "redis.sock" for r in roots if r and Path(r).is_absolute()]
    fitting = [p for p in shorts if len(os.fsencode(p)) <= MAX_SOCKET_PATH]
    return fitting[0] if fitting else min([own, *shorts], key=lambda p: len(os.fsencode(p)))


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class HookAllowlist:
    """MXQ_HOOK_ALLOWED_HOSTS parsed: host names, `*.domain` (its subdomains), and addresses or
    networks, which alone open private, loopback and link-local addresses to webhooks."""

    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # `.example.com` for `*.example.com`
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, value: str | None) -> HookAllowlist:
        names, domains, networks = set(), [], []
        for entry in (e.strip().lower().rstrip(".") for e in (value or "").split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            label = entry.removeprefix("*.")
            if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", label):
                raise ValueError(f"MXQ_HOOK_ALLOWED_HOSTS: {entry!r} is not a host name, `*.domain`, "
                                 "an IP address or a network")
            if entry.startswith("*."):
                domains.append(f".{label}")
            else:
                names.add(label)
        return cls(frozenset(names), tuple(domains), tuple(networks))

    def __bool__(self) -> bool:
        return bool(self.names or self.domains or self.networks)

    def names_host(self, host: str) -> bool:
        """The URL's host is listed: by name, under a listed domain, or as an address in a
        listed network."""
        host = host.lower().rstrip(".")
        try:
            return self.holds(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            return host in self.names or any(host.endswith(d) for d in self.domains)

    def holds(self, address: IPAddress) -> bool:
        return any(address in n for n in self.networks if n.version == address.version)


def allowed(field: str) -> str | None:
    """The range a numeric setting accepts, as `> 0 and <= 3600`, for error messages."""
    info = Settings.model_fields.get(field)
    if info is None:
        return None
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    parts = [f"{sign} {getattr(m, key):g}" if isinstance(getattr(m, key), float)
             else f"{sign} {getattr(m, key)}"
             for m in info.metadata for key, sign in words.items() if hasattr(m, key)]
    return " and ".join(parts) or None


def is_loopback(host: str) -> bool:
    """A name or address of this machine only (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once, with the broker and database of the home's stack
    (`with_recorded_stack`)."""
    return with_recorded_stack(Settings())
