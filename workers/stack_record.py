"""The stack record (`$MXQ_HOME/stack.json`): what `mxq up` / `mxq worker` started the stack with
(its data root, object storage settings, API address, broker and database URLs without their
passwords), written by `record_stack` and read by every process and command of the home
(`with_recorded_stack`), so that a shell without those variables reaches the stack it started
and one that names another is told so. Settings are passed in, never imported at run time here
(`workers/settings/` imports this module)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from mxq.errors import UserError

if TYPE_CHECKING:
    from mxq.workers.settings import Settings

STACK_RECORD = "stack.json"  # in $MXQ_HOME: what `mxq up` started with, read by every process
# The settings `record_stack` keeps (URLs without their password) and how each is named to users.
RECORDED_URLS = (("broker_url", "broker", "MXQ_BROKER_URL"),
                 ("database_url", "database", "MXQ_DATABASE_URL"))


class StackMismatch(UserError):
    """This shell's broker or database is not the one the home's stack runs with."""


def without_password(url: str) -> tuple[str, bool]:
    """The URL with its password removed, and whether it had one (stack.json never holds one)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, False
    user = f"{parts.username}@" if parts.username else ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=user + host)), True


# Settings the whole stack shares, recorded by `mxq up` / `mxq worker` and reused by every
# process of the home that leaves them unset (a `mxq down; mxq up` without MXQ_DATA_ROOT moved
# the data root to the default, and the next job failed).
RECORDED_VALUES = (("s3_allowed", "MXQ_S3_ALLOWED"), ("s3_endpoint_url", "MXQ_S3_ENDPOINT_URL"),
                   ("s3_model_store", "MXQ_S3_MODEL_STORE"))


def record_stack(settings: Settings) -> list[str]:
    """At `mxq up` / `mxq worker`: the data root, object storage settings, broker and database
    the stack runs with (its URLs without their password), for every process and command with
    this home to use; keys written by others are kept. A value given anew that differs from the
    recorded one wins, and is announced: the notes, one line each."""
    path = settings.home_path / STACK_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(recorded_stack(settings.home_path) or {})
    notes = _changed(record, "data_root", "MXQ_DATA_ROOT", str(settings.own_data_root))
    record["data_root"] = str(settings.own_data_root)
    for field, env in RECORDED_VALUES:
        notes += _changed(record, field, env, getattr(settings, field))
        record[field] = getattr(settings, field)
    record.update(api_host=settings.api_host, api_port=settings.api_port)  # for mxq.client.Client()
    for _, key, env in RECORDED_URLS:  # compared and announced without their password
        url, secret = without_password(getattr(settings, key))
        notes += _changed(record, key, env, url)
        record.update({key: url, f"{key}_password": secret})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    return notes


def _changed(record: dict[str, object], key: str, env: str, now: str | None) -> list[str]:
    was = record.get(key)
    if key not in record or was == now:
        return []
    return [f"{env}={now or '(unset)'} replaces the stack's {key} {was or '(unset)'} (recorded in "
            f"{STACK_RECORD})"]


def recorded_stack(home: Path) -> dict[str, object] | None:
    """What `record_stack` wrote in this home (None without a readable record)."""
    path = home / STACK_RECORD
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _read_record(path, stamp)


def recorded_data_root(home: Path) -> Path | None:
    root = (recorded_stack(home) or {}).get("data_root")
    return Path(root) if isinstance(root, str) and root else None


@lru_cache(maxsize=8)
def _read_record(path: Path, _stamp: int) -> dict[str, object] | None:
    """The record, read once per version of the file (submit_many asks per job); callers must
    not change it."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def with_recorded_stack(settings: Settings, own: bool = False) -> Settings:
    """The settings with the broker and database of this home's stack: a URL the environment
    leaves unset is the recorded one; one it sets must be that one, password aside, or this
    raises StackMismatch naming both. `own`: for `mxq up` / `mxq worker`, which record the stack
    anew, so a URL they are given wins (the stack moves to it)."""
    record = recorded_stack(settings.home_path)
    if record is None:
        return settings
    where = settings.home_path / STACK_RECORD
    updates: dict[str, object] = _recorded_values(settings, record)
    for field, key, env in RECORDED_URLS:
        recorded = record.get(key)
        if not isinstance(recorded, str):
            continue
        given = getattr(settings, field)
        if given is None and recorded != without_password(getattr(settings, key))[0]:
            if record.get(f"{key}_password"):
                raise StackMismatch(
                    f"this home's stack runs with {key} {recorded} (recorded in {where}), whose "
                    f"password is not stored; set {env} to it (or to another {key} to move the "
                    "stack there), or use another MXQ_HOME")
            updates[field] = recorded
        elif given is not None and not own and without_password(given)[0] != recorded:
            raise StackMismatch(
                f"this home's stack runs with {key} {recorded} (recorded in {where}) but {env} "
                f"says {without_password(given)[0]}; unset it or use another MXQ_HOME")
    return settings.model_copy(update=updates) if updates else settings


def _recorded_values(settings: Settings, record: dict[str, object]) -> dict[str, object]:
    """The shared values (data root, object storage) this process leaves unset: the stack's."""
    found: dict[str, object] = {}
    if settings.data_root is None and isinstance(record.get("data_root"), str):
        found["data_root"] = Path(str(record["data_root"]))
    for field, _ in RECORDED_VALUES:
        if getattr(settings, field) is None and isinstance(record.get(field), str):
            found[field] = record[field]
    return found
