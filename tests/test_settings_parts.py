"""The settings' parts (workers/settings/): `Settings` is made of one part per component, and each
component's view carries that part's values, parsed, so code handed a view sees what the
process's settings say."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxq.objects import ObjectURL
from mxq.workers.settings import Settings
from mxq.workers.settings.api import ApiFields
from mxq.workers.settings.broker import BrokerFields
from mxq.workers.settings.cadences import CadenceFields
from mxq.workers.settings.database import DatabaseFields
from mxq.workers.settings.devices import DeviceFields
from mxq.workers.settings.limits import LimitFields
from mxq.workers.settings.storage import StorageFields
from mxq.workers.settings.webhooks import HookAllowlist, WebhookFields

PARTS = (ApiFields, BrokerFields, CadenceFields, DatabaseFields, DeviceFields, LimitFields,
         StorageFields, WebhookFields)
OWN = {"home", "node", "data_root", "node_address"}  # the stack's, no one component's


def test_every_setting_is_in_one_part_or_the_stack_s_own() -> None:
    owners: dict[str, list[str]] = {}
    for part in PARTS:
        for name in part.model_fields:
            owners.setdefault(name, []).append(part.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    assert set(Settings.model_fields) == set(owners) | OWN


def test_each_view_carries_its_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXQ_HOOK_ALLOWED_HOSTS", "hooks.example.com,*.example.org,10.0.0.0/8")
    monkeypatch.setenv("MXQ_HOOK_TIMEOUT_SECONDS", "3")
    monkeypatch.setenv("MXQ_S3_ALLOWED", "data/team-a")
    monkeypatch.setenv("MXQ_S3_TIMEOUT_SECONDS", "9")
    monkeypatch.setenv("MXQ_MAX_EPOCHS", "7")
    monkeypatch.setenv("MXQ_HOST_GPUS", "1,3")
    s = Settings(home=tmp_path)
    hooks = s.webhooks
    assert hooks.timeout_seconds == 3 and hooks.every_seconds == s.hook_seconds
    assert hooks.allowlist == HookAllowlist.parse(s.hook_allowed_hosts) == s.hook_allowlist
    assert hooks.allowlist.names_host("a.example.org") and not hooks.allowlist.names_host("example.net")
    storage = s.storage
    assert storage.timeout_seconds == 9 and storage.allowed == s.s3_allowed_prefixes
    assert storage.allowed.admits(ObjectURL("data", "team-a/x.npy"))
    assert s.limits.max_epochs == 7 and s.devices.host_gpu_ids == (1, 3)
    assert s.broker_settings.url == s.broker and s.broker_settings.embedded
    assert s.database_settings.url == s.database


def test_the_allowlist_refuses_what_is_no_host() -> None:
    with pytest.raises(ValueError, match="'bad_name' is not a host name"):
        HookAllowlist.parse("hooks.example.com,bad_name")
    assert not HookAllowlist.parse(" , ")
