"""`Settings`: the one object read from the environment, made of the components' parts (each
part a module of this package with its fields, defaults and validators), plus what belongs to
no one component: the home, the node and its address, the data root."""

from __future__ import annotations

import ipaddress
import os
import socket
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from mxq.workers.settings.api import ApiFields
from mxq.workers.settings.broker import MAX_SOCKET_PATH, BrokerFields, BrokerSettings, redis_socket_path
from mxq.workers.settings.cadences import CadenceFields
from mxq.workers.settings.database import DatabaseFields, DatabaseSettings
from mxq.workers.settings.devices import DeviceFields
from mxq.workers.settings.limits import LimitFields
from mxq.workers.settings.storage import StorageFields
from mxq.workers.settings.webhooks import WebhookFields
from mxq.workers.stack_record import STACK_RECORD, recorded_data_root, with_recorded_stack

# The limited broadcast address: it names no host, so no node can be reached at it.
BROADCAST = ipaddress.IPv4Address("255.255.255.255")


class Settings(BrokerFields, DatabaseFields, StorageFields, WebhookFields, LimitFields, DeviceFields,
               CadenceFields, ApiFields):
    """mxq configuration; `MXQ_<FIELD>` sets each field. Each component's code takes its own
    part, parsed and frozen: `broker_settings`, `database_settings`, `storage`, `webhooks`,
    `limits`, `devices` (`broker` and `database` are the URLs every layer passes)."""

    model_config = SettingsConfigDict(env_prefix="MXQ_", extra="ignore", allow_inf_nan=False)

    home: Path = Field(Path("var"), description="State folder: embedded Redis, SQLite, logs, pids.")
    node: str = Field(
        default_factory=lambda: socket.gethostname().split(".")[0], description="This machine's name."
    )
    data_root: Path | None = Field(
        None, description="Job inputs must lie inside this folder. Unset: your home folder, or "
        "$MXQ_HOME/data when the API listens beyond loopback. `mxq up` records the one it starts "
        "with in $MXQ_HOME/stack.json, and every process of the stack uses that one.")
    node_address: str | None = Field(
        None, description="IPv4 address of this host that other nodes reach it at (multi-node "
        "training: the ps-lite scheduler, server and workers bind it and announce it, so it must "
        "be this host's own: in a container, use host networking); unset or empty = the address "
        "of the interface the default route uses, else 127.0.0.1."
    )

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
    def broker_settings(self) -> BrokerSettings:
        """What the broker's connection needs of the settings (its URL resolved in the home)."""
        return BrokerSettings(self.broker, self.embedded_broker, self.visibility_timeout,
                              self.broker_timeout_seconds)

    @property
    def database_settings(self) -> DatabaseSettings:
        return DatabaseSettings(self.database)

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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once, with the broker and database of the home's stack
    (`with_recorded_stack`)."""
    return with_recorded_stack(Settings())
