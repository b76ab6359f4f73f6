"""All of mxq's settings, read once from `MXQ_*` environment variables.

Every default is a named value here with a line saying why, so there is one place to look.
Read at the edges (a worker's, a training child's or the API's start, the CLI) and passed in:
the modules that read `os.environ` besides this package start processes with it or are the
start of one (tests/house/test_settings_edges.py lists them).

One object, `Settings` (`environment.py`), is read from the environment; it is made of one part
per component, each a module with its fields, defaults and validators: the broker
(`broker.py`), the database (`database.py`), object storage (`storage.py`), the webhooks
(`webhooks.py`, with MXQ_HOOK_ALLOWED_HOSTS's parser `HookAllowlist`), the limits on requests
(`limits.py`), the devices (`devices.py`), the stack's cadences (`cadences.py`) and the HTTP API
(`api.py`); `part.py` holds what they share. Each component's code takes its own part, parsed and
frozen (`settings.storage`, `settings.webhooks`, `settings.broker_settings`, ...).

Imports (of mxq): core, workers.stack_record.
"""

from mxq.workers.settings.api import MIN_TOKEN_CHARS, is_loopback
from mxq.workers.settings.broker import (
    DEFAULT_BROKER_TIMEOUT_SECONDS,
    DEFAULT_VISIBILITY_TIMEOUT,
    MAX_SOCKET_PATH,
    BrokerSettings,
    redis_socket_path,
)
from mxq.workers.settings.cadences import HEARTBEAT_TTL_FACTOR
from mxq.workers.settings.database import DatabaseSettings
from mxq.workers.settings.devices import DEFAULT_CPU_DEVICES, MAX_CPU_DEVICES, DeviceSettings, usable_cores
from mxq.workers.settings.environment import Settings, allowed, get_settings
from mxq.workers.settings.limits import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_EPOCHS,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_INPUT_BYTES,
    DEFAULT_MAX_PROBE_GFLOP,
    Limits,
)
from mxq.workers.settings.storage import StorageSettings
from mxq.workers.settings.webhooks import HookAllowlist, IPAddress, WebhookSettings

__all__ = [
    "DEFAULT_BROKER_TIMEOUT_SECONDS", "DEFAULT_CPU_DEVICES", "DEFAULT_MAX_BATCH_SIZE", "DEFAULT_MAX_EPOCHS",
    "DEFAULT_MAX_IMAGE_PIXELS", "DEFAULT_MAX_INPUT_BYTES", "DEFAULT_MAX_PROBE_GFLOP",
    "DEFAULT_VISIBILITY_TIMEOUT", "HEARTBEAT_TTL_FACTOR", "MAX_CPU_DEVICES", "MAX_SOCKET_PATH",
    "MIN_TOKEN_CHARS", "BrokerSettings", "DatabaseSettings", "DeviceSettings", "HookAllowlist",
    "IPAddress", "Limits", "Settings", "StorageSettings", "WebhookSettings", "allowed", "get_settings",
    "is_loopback", "redis_socket_path", "usable_cores",
]
