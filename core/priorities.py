"""Job priorities: the three levels users name, which job a worker takes first, and which running
job yields to a waiting one (preemption). Pure rules: the broker and SQL apply them elsewhere.

A queued job of a higher level is always delivered before one of a lower level that the same
device could run; within a level, first in first out. A preempted job goes back ahead of the
jobs of its level that never started, since it started before them: it keeps its position.

No job starves: a job is preempted at most MAX_PREEMPTIONS times (then it runs to its end), and
never twice by the same waiting job; a waiting job only preempts one of a strictly lower level,
or one borrowing a device beyond its owner's quota (`mxq.shares`), which is taken back first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from mxq.errors import UserError


class Level(StrEnum):
    """A job's priority level (stored and sent as its name)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


HIGH, NORMAL, LOW = Level.HIGH, Level.NORMAL, Level.LOW
LEVELS = (HIGH, NORMAL, LOW)  # first taken first
DEFAULT = NORMAL
RANK: dict[str, int] = {HIGH: 2, NORMAL: 1, LOW: 0}  # by name: rows and messages carry it as text
# How often one job may be made to yield before it is left to run to its end.
MAX_PREEMPTIONS = 3


class PriorityError(UserError):
    """A priority that is not one of the levels."""


def parse(text: str | None) -> Level:
    """The level `text` names (None: the default), or a one-line PriorityError."""
    if text is None:
        return DEFAULT
    level = text.strip().lower()
    if level not in RANK:
        raise PriorityError(f"priority {text[:40]!r} is not allowed: use high, normal or low")
    return Level(level)


@dataclass(frozen=True)
class Priority:
    """A job's level and whether it may be made to yield to a waiting job of a higher level."""

    level: Level = DEFAULT
    preemptible: bool = False

    @classmethod
    def of(cls, level: str | None = None, preemptible: bool | None = None) -> Priority:
        """As a user asks: a level's name (checked), and preemptible unless said, for `low` only."""
        parsed = parse(level)
        return cls(parsed, parsed == LOW if preemptible is None else preemptible)


@dataclass(frozen=True)
class Running:
    """A running job as preemption sees it: its level, whether it may yield, the devices it
    holds (`node/device` labels), and its preemption history."""

    id: int
    level: str
    preemptible: bool
    devices: frozenset[str]
    started_at: datetime
    preemptions: int = 0
    preempted_by: tuple[int, ...] = ()
    yielding_to: int | None = None  # asked to yield already (to this job), not yet done
    parts: bool = False  # a part of a multi-node training: never yields alone
    borrowed: bool = False  # runs beyond its owner's quota (mxq.shares): taken back first

    def may_yield_to(self, waiting: Waiting) -> bool:
        if (self.parts or self.yielding_to is not None or waiting.id in self.preempted_by
                or self.preemptions >= MAX_PREEMPTIONS):
            return False
        if self.borrowed and not waiting.borrowed:  # any job within its quota takes it back
            return True
        return self.preemptible and RANK[self.level] < RANK[waiting.level]


@dataclass(frozen=True)
class Waiting:
    """A queued job and the devices that could run it (`node/device` labels)."""

    id: int
    level: str
    capable: frozenset[str] = field(default_factory=frozenset)
    needs: int = 1  # devices at once (a training of K devices)
    borrowed: bool = False  # admitted beyond its owner's quota: takes back no borrowed device


def victim(waiting: Waiting, running: Iterable[Running]) -> int | None:
    """The running job that should yield to `waiting`, or None: enough devices that could run it
    are free (it will be taken there), one already yields to it, or none may yield to it.

    Of those that may, a borrowed one first (beyond its owner's quota), then the lowest level,
    then the one that started last (it loses the least position among its level)."""
    jobs = list(running)
    held = frozenset().union(*(j.devices for j in jobs))
    if not waiting.capable or len(waiting.capable - held) >= waiting.needs:
        return None
    if any(j.yielding_to == waiting.id for j in jobs):
        return None
    able = [j for j in jobs if j.devices & waiting.capable and j.may_yield_to(waiting)]
    if not able:
        return None
    return min(able, key=lambda j: (not j.borrowed, RANK[j.level], -j.started_at.timestamp())).id


def attempts(claims: int, preemptions: int, waits_to_resume: bool) -> int:
    """The attempts a user sees. Every claim of a job is a new fence (`mxq.db.fence`), so the
    claims count resumptions too; but a preemption is not an attempt: the claim that resumes a
    job after it yielded continues the attempt that yielded. `waits_to_resume`: its last claim
    yielded and none resumed it yet (it waits, or was cancelled while it waited)."""
    return claims - preemptions + (1 if waits_to_resume and claims > 0 else 0)
