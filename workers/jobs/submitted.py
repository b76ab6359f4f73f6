"""What a submit is given beside the jobs' parameters (`SubmitOptions`: where they run, their
turn, owner, team, the jobs they wait for, an idempotency key), and what it answers for each job
(`Submitted`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mxq.priorities import Priority


@dataclass(frozen=True)
class SubmitOptions:
    """Where jobs run (`device`: auto, auto:gpu, gpu:N, ...; with `allow_offline`, a device whose
    worker is not live yet), who owns them (default: `local:<login>`, this machine's user) and
    which team reads them, their `priority`, the jobs they wait for (`after`), and the
    idempotency key that makes a retry of the submit return its first jobs."""

    device: str = "auto"
    allow_offline: bool = False
    idempotency_key: str | None = None
    owner: str | None = None
    priority: Priority = Priority()
    team: str | None = None
    after: Sequence[int] | None = None


DEFAULT_OPTIONS = SubmitOptions()  # auto device, live workers only, no key, this user, normal turn


@dataclass(frozen=True)
class Submitted:
    """What a submit did: the job, whether its message went out (None for a replay, which
    publishes nothing), whether it replayed an earlier submit with the same key, and a note
    saying either of those in words."""

    job_id: int
    published: bool | None
    replayed: bool = False
    note: str | None = None
