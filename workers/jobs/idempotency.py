"""Idempotency keys: a retry of the same submit (same key, same owner) returns the jobs the first
one made instead of new ones; the same key with another request is a conflict."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mxq.db.records import JobRecord
from mxq.db.reports.history import jobs_by_keys
from mxq.errors import Conflict
from mxq.json_types import JsonObject
from mxq.priorities import Priority
from mxq.status import JobKind
from mxq.workers.broker.routing import Route
from mxq.workers.jobs.kinds.params import ParamsError
from mxq.workers.jobs.submitted import Submitted
from mxq.workers.settings import Settings

# An idempotency key comes from outside (a header, a flag): bounded, one line, no spaces; a UUID,
# a ULID or a base64 digest fits (the column holds 128 characters).
MAX_KEY_CHARS = 128
IDEMPOTENCY_KEY_PATTERN = rf"^[A-Za-z0-9._:+/=-]{{1,{MAX_KEY_CHARS}}}$"


class IdempotencyConflict(Conflict):
    """The idempotency key was used before by a job with other parameters."""


def check_key(key: str | None) -> str | None:
    """The idempotency key, or a one-line ParamsError naming what is allowed."""
    if key is None or re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        return key
    shown = repr(key[:40]) + (f"... ({len(key)} characters)" if len(key) > 40 else "")
    raise ParamsError(f"idempotency key {shown} is not allowed: use 1 to 128 of the characters "
                      "A-Z a-z 0-9 . _ : + / = - (a UUID fits)")


@dataclass(frozen=True)
class Request:
    """What a submit asks for, beside its parameters: compared whole when a key is replayed."""

    kind: JobKind
    owner: str
    priority: Priority
    team: str | None
    after: list[int] | None = None  # the jobs it waits for (`--after`)


def _same_request(record: JobRecord, asked: Request, params: JsonObject, where: Route) -> bool:
    """The stored job is what this request (its parameters prepared) would make: kind, device,
    parameters as JSON stores them, priority, preemptibility, team and the jobs it waits for."""
    return (record["kind"] == asked.kind and record["requested_device"] == where.requested
            and record["params"] == params
            and record["priority"] == asked.priority.level
            and record["preemptible"] == asked.priority.preemptible
            and record["team"] == asked.team and record["after"] == asked.after)


def keys_of(key: str | None, count: int) -> list[str] | None:
    """Each job's idempotency key: the key itself for the first (or only) job, `KEY#i` for job i
    of a batch after it (`#` is not allowed in a key, so no user's key is ever one of these)."""
    if key is None:
        return None
    keys = [key] + [f"{key}#{i}" for i in range(1, count)]
    if len(keys[-1]) > MAX_KEY_CHARS:
        raise ParamsError(f"idempotency key of {len(key)} characters is too long for a batch of "
                          f"{count} jobs: at most {MAX_KEY_CHARS - len(keys[-1]) + len(key)}")
    return keys


def replay(settings: Settings, keys: list[str], asked: Request, params: Sequence[JsonObject],
            where: Route) -> list[Submitted] | None:
    """The earlier jobs their owner made with these keys, when they are this request's;
    IdempotencyConflict when they are another request's (one more job or one fewer included);
    None when the key is new to this owner (keys are per owner: another user's key finds nothing
    of theirs)."""
    key = keys[0]
    records = jobs_by_keys(settings.database, [*keys, f"{key}#{len(keys)}"], asked.owner)
    if not records:
        return None
    if len(records) != len(params) or not all(
            _same_request(r, asked, p, where) for r, p in zip(records, params, strict=True)):
        raise IdempotencyConflict(
            f"idempotency key {key!r} was used by job {records[0]['id']} with other parameters; "
            "a retry must send the same request, a new job needs a new key")
    ids = ", ".join(str(r["id"]) for r in records)
    return [Submitted(r["id"], None, replayed=True,
                      note=f"a replay: job {ids} was submitted with idempotency key {key!r} "
                           "before; nothing new was queued") for r in records]
