"""The promotion policy of a scheduled retraining: promote the new version, or keep the old.

Pure: it decides from values; `mxq.db.schedules.decide_promotion` reads them and stores the
outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PromotionPolicy:
    promote: str  # "if-better" (by `metric`, by at least `min_gain`), "always" or "never"
    metric: str
    min_gain: float
    min_metric: float | None = None  # the floor: below it never promoted, whatever `promote` says


@dataclass(frozen=True)
class Decision:
    promoted: bool
    reason: str


def decide(policy: PromotionPolicy, new: float | None, current: float | None,
           has_current: bool) -> Decision:
    """`new` is the new version's metric, `current` the promoted version's (None when it has
    none, or when `has_current` is False: no version is promoted)."""
    metric, gain, floor = policy.metric, policy.min_gain, policy.min_metric
    if policy.promote == "never":
        return Decision(False, "policy is never")
    if floor is not None and (new is None or new < floor):
        shown = "none" if new is None else f"{new:.4f}"
        return Decision(False, f"{metric} {shown} is below the floor {floor} (--min-metric)")
    if policy.promote == "always":
        return Decision(True, "policy is always")
    if new is None:
        return Decision(False, f"the new version has no {metric}")
    if not has_current or current is None:
        return Decision(True, "no promoted version to compare with")
    if new >= current + gain:
        return Decision(True, f"{metric} {new:.4f} >= {current:.4f} + min gain {gain}")
    return Decision(False, f"{metric} {new:.4f} < {current:.4f} + min gain {gain}")


def decision_record(decision: Decision, policy: PromotionPolicy, new_version: int,
                    new_value: float | None, promoted_version: int | None,
                    promoted_value: float | None) -> dict[str, Any]:
    """The fire's stored `promotion` (shown by `mxq schedule show` and the API)."""
    return {"decision": "promoted" if decision.promoted else "kept", "metric": policy.metric,
            "new_version": new_version, "new_value": new_value,
            "promoted_version": promoted_version, "promoted_value": promoted_value,
            "reason": decision.reason}
