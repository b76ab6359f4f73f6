"""Fair shares and quotas: which held job the admitter hands to the broker next. Pure rules:
SQL and the broker apply them (`mxq.workers.jobs.admit`).

Each owner has a weight (`share`, 1 by default) and may have a quota (`max_devices` at once).
A job beyond its owner's quota waits, held in SQL, and says so. Among the jobs that may go, the
higher priority first; within a priority, the owner whose recent use, over its weight, is the
smallest (recent use: device-seconds over the fair-share window, plus the devices it holds now
counted at a typical job's length), so that while devices are contended each owner's
device-seconds approach its share of the weights; then the oldest job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mxq.priorities import RANK


@dataclass(frozen=True)
class Share:
    """An owner's weight and quota (owners that are not users: weight 1, no quota)."""

    weight: float = 1.0
    max_devices: int | None = None


@dataclass(frozen=True)
class Held:
    """A held job: its owner, priority level, the devices it needs at once, its queue."""

    id: int
    owner: str
    level: str
    needs: int = 1
    queue: str = ""
    started_before: bool = False


@dataclass
class Usage:
    """What each owner uses: device-seconds over the window, and devices held now (running, or
    admitted and waiting for a worker)."""

    seconds: dict[str, float]
    devices: dict[str, int]
    typical_seconds: float = 1.0  # a recent job's device-seconds: what a device held now will cost

    def load(self, owner: str, share: Share) -> float:
        used = self.seconds.get(owner, 0.0) + self.devices.get(owner, 0) * self.typical_seconds
        return used / max(share.weight, 1e-9)

    def take(self, job: Held) -> None:
        self.devices[job.owner] = self.devices.get(job.owner, 0) + job.needs


def devices_needed(kind: str, params: Mapping[str, object]) -> int:
    """The devices a job holds at once on its node: a training's `devices`, else one (read from
    its parameters as stored, where admission reads them too)."""
    devices = params.get("devices")
    return devices if kind == "train" and isinstance(devices, int) and devices > 0 else 1


def beyond_quota(needs: int, share: Share) -> str | None:
    """Why a job needing `needs` devices at once can never run under `share`'s quota (it would
    wait for ever, held), or None when it can."""
    if share.max_devices is None or needs <= share.max_devices:
        return None
    return (f"it needs {needs} devices at once and its owner's quota is {share.max_devices} "
            "(`mxq users set NAME --max-devices N`)")


def over_quota(job: Held, share: Share, usage: Usage) -> bool:
    return share.max_devices is not None and usage.devices.get(job.owner, 0) + job.needs > share.max_devices


def quota_reason(share: Share, in_use: int) -> str:
    """Why a job of an owner at its quota waits, as `mxq job` and the queue view say it."""
    n = share.max_devices
    return f"waiting: quota {n} device{'s' if n != 1 else ''}, {in_use} in use"


def next_held(held: Iterable[Held], shares: dict[str, Share], usage: Usage) -> Held | None:
    """The job to admit next of `held` (those over quota never), or None."""
    able = [j for j in held if not over_quota(j, shares.get(j.owner, Share()), usage)]
    if not able:
        return None
    return min(able, key=lambda j: (-RANK[j.level], not j.started_before,
                                    usage.load(j.owner, shares.get(j.owner, Share())), j.id))
