"""Devices a fault may have come from, each to be probed before it takes work again.

A K-device training whose device failed rarely says which: MXNet raises a CUDA error at the next
synchronisation, from whichever context, so the leader cannot tell its own device from the K-1
it leased. Taking out only its own device left a faulty one in service: the job, queued again,
ran on it and failed at its second fault. So every device of such a training is a suspect (only
the one the error names, when it names one): its worker takes its device out before it takes
another job (`mxq.tasks.runner`), and the launcher's start check, not the next job, decides.
A key in Redis per device, like the leases: the workers that read them already talk to it.
"""

from __future__ import annotations

from mxq.workers.broker.redis_client import client

# A suspicion no worker reads (its node gone for good) does not stay for ever.
SUSPECT_TTL = 7 * 86400
# Read and clear in one step: two deliveries on one worker never both see it.
_TAKE = "local v = redis.call('get', KEYS[1]) redis.call('del', KEYS[1]) return v"


def key(node: str, device: str) -> str:
    return f"mxq:suspect:{node}:{device}"


def suspect(broker: str, node: str, devices: list[str], why: str) -> None:
    """Mark `devices` of `node` to be probed before they take work, saying why."""
    pipe = client(broker).pipeline()
    for device in devices:
        pipe.set(key(node, device), why, ex=SUSPECT_TTL)
    pipe.execute()


def take(broker: str, node: str, device: str) -> str | None:
    """Why `device` is to be probed, clearing it; None when it is not a suspect."""
    value = client(broker).eval(_TAKE, 1, key(node, device))
    return value.decode() if isinstance(value, bytes) else value


def pending(broker: str, node: str, devices: list[str]) -> set[str]:
    """Which of `devices` are suspects still (their workers have not gone out yet): no training
    leases them meanwhile."""
    if not devices:
        return set()
    values = client(broker).mget([key(node, d) for d in devices])
    return {d for d, v in zip(devices, values, strict=True) if v is not None}
