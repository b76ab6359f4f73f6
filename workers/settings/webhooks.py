"""The webhooks' settings: which hosts endpoints may be at (MXQ_HOOK_ALLOWED_HOSTS, parsed here
into a `HookAllowlist`), how long an attempt may take, and how often the sender runs."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from pydantic import Field, field_validator

from mxq.workers.settings.part import HOUR, Part

# A webhook's POST gives up when a phase (connect, send, each read of the answer) takes longer:
# a slow or hung endpoint holds one of the sender's threads this long, never a job or a request.
DEFAULT_HOOK_TIMEOUT_SECONDS = 10.0
# A host name of the allowlist: dot-separated labels of letters, digits and inner hyphens.
HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class HookAllowlist:
    """MXQ_HOOK_ALLOWED_HOSTS parsed: host names, `*.domain` (its subdomains), and addresses or
    networks, which alone open private, loopback and link-local addresses to webhooks."""

    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # `.example.com` for `*.example.com`
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, value: str | None) -> HookAllowlist:
        names: set[str] = set()
        domains: list[str] = []
        networks: list[IPNetwork] = []
        for entry in (e.strip().lower().rstrip(".") for e in (value or "").split(",")):
            if not entry:
                continue
            network = _network(entry)
            if network is not None:
                networks.append(network)
            elif entry.startswith("*."):
                domains.append(f".{_host_name(entry, entry.removeprefix('*.'))}")
            else:
                names.add(_host_name(entry, entry))
        return cls(frozenset(names), tuple(domains), tuple(networks))

    def __bool__(self) -> bool:
        return bool(self.names or self.domains or self.networks)

    def names_host(self, host: str) -> bool:
        """The URL's host is listed: by name, under a listed domain, or as an address in a
        listed network."""
        host = host.lower().rstrip(".")
        try:
            return self.holds(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            return host in self.names or any(host.endswith(d) for d in self.domains)

    def holds(self, address: IPAddress) -> bool:
        return any(address in n for n in self.networks if n.version == address.version)


def _network(entry: str) -> IPNetwork | None:
    """The entry as an address or network (`10.0.0.0/8`, `[::1]`), else None."""
    try:
        return ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        return None


def _host_name(entry: str, label: str) -> str:
    """`label` (the entry without its `*.`) if it is a host name, else the one-line reason."""
    if not HOST_NAME.fullmatch(label):
        raise ValueError(f"MXQ_HOOK_ALLOWED_HOSTS: {entry!r} is not a host name, `*.domain`, "
                         "an IP address or a network")
    return label


class WebhookFields(Part):
    hook_allowed_hosts: str | None = Field(
        None, description="Hosts webhook endpoints may be at (comma-separated: `hooks.example.com`, "
        "`*.example.com` for its subdomains, an IP address or network such as `10.0.0.0/8`); unset "
        "or empty = no webhook may be added or sent. A name must resolve to public addresses only, "
        "unless an address or network listed here holds each of its addresses: private, loopback "
        "and link-local addresses are reached only when named so.")
    hook_timeout_seconds: float = Field(
        DEFAULT_HOOK_TIMEOUT_SECONDS, gt=0, le=300,
        description="Longest a webhook attempt takes in all, from connecting to the answer's "
        "status line; past it the attempt failed and is retried later.")
    hook_seconds: float = Field(5.0, gt=0, le=HOUR, description="How often the schedule process "
                                "sends the due webhook deliveries.")

    @field_validator("hook_allowed_hosts")
    @classmethod
    def _hook_allowed_hosts_parse(cls, value: str | None) -> str | None:
        if value is not None:
            HookAllowlist.parse(value)
        return value

    @property
    def hook_allowlist(self) -> HookAllowlist:
        return HookAllowlist.parse(self.hook_allowed_hosts)

    @property
    def webhooks(self) -> WebhookSettings:
        """What the webhooks (their checks and their sender) need of the settings."""
        return WebhookSettings(self.hook_allowlist, self.hook_timeout_seconds, self.hook_seconds)


@dataclass(frozen=True)
class WebhookSettings:
    """The webhooks' settings, parsed: the allowlist, the bound of one attempt, and how often the
    schedule process sends the due deliveries."""

    allowlist: HookAllowlist
    timeout_seconds: float
    every_seconds: float
