"""Device leases in Redis: a K-device job holds K devices of one node, each key with a TTL that
its holder renews. Keys are taken in a fixed (sorted) order, so two jobs never hold parts of each
other's sets while waiting; a holder that dies stops renewing and its devices return on expiry.
"""

from __future__ import annotations

from mxq.device import Device
from mxq.workers.broker.redis_client import client

# Compare-and-set scripts: only the holder may renew or release its lease.
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
          "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0")
RELEASE_SCRIPT = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
                  "return redis.call('del', KEYS[1]) end return 0")


def key(node: str, device: str) -> str:
    return f"mxq:lease:{node}:{device}"


def _order(devices: list[str]) -> list[str]:
    return sorted(devices, key=Device.parse)


def acquire(broker: str, node: str, devices: list[str], job_id: int, ttl: float) -> bool:
    """Take every lease (re-taking our own), in order; on any refusal give back what was taken."""
    r, taken, ms = client(broker), [], int(ttl * 1000)
    for device in _order(devices):
        k = key(node, device)
        if r.set(k, str(job_id), nx=True, px=ms) or r.eval(_RENEW, 1, k, str(job_id), ms):
            taken.append(device)
            continue
        release(broker, node, taken, job_id)
        return False
    return True


def renew(broker: str, node: str, devices: list[str], job_id: int, ttl: float) -> bool:
    """Extend the job's leases; False if one was lost (expired and taken by another job)."""
    r = client(broker)
    return all(r.eval(_RENEW, 1, key(node, d), str(job_id), int(ttl * 1000)) for d in devices)


def release(broker: str, node: str, devices: list[str], job_id: int) -> None:
    r = client(broker)
    for d in devices:
        r.eval(RELEASE_SCRIPT, 1, key(node, d), str(job_id))


def holders(broker: str, node: str, devices: list[str]) -> dict[str, int | None]:
    """Which job holds each device (None: free)."""
    if not devices:
        return {}
    values = client(broker).mget([key(node, d) for d in devices])
    return {d: int(v) if v else None for d, v in zip(devices, values, strict=True)}


def held(broker: str, devices: list[tuple[str, str]]) -> dict[tuple[str, str], int | None]:
    """Which job holds each (node, device), in one round trip (the device table of a fleet)."""
    if not devices:
        return {}
    values = client(broker).mget([key(node, d) for node, d in devices])
    return {nd: int(v) if v else None for nd, v in zip(devices, values, strict=True)}
