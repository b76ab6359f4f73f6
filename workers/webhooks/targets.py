"""Which webhook endpoints may be reached: a URL's host must be listed in
MXQ_HOOK_ALLOWED_HOSTS, and every address its name resolves to must be public, unless an
address or network listed there holds it (private, loopback, link-local and reserved addresses
are reached only when named so). Checked when an endpoint is added and again at every send (a
name's addresses may change); the sender connects to the very address it checked.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from mxq.errors import UserError
from mxq.workers.settings.webhooks import HookAllowlist, IPAddress

SCHEMES = ("https", "http")
MAX_URL = 2000
# What the API's schema states a webhook URL is (so that a URL it allows is refused only for what
# no schema can say: a host outside MXQ_HOOK_ALLOWED_HOSTS, addresses that are not public): http
# or https, no credentials, a host that is a name with a letter, a dotted IPv4 address or a
# bracketed IPv6 one (never `0` or `1.2`), a port from 1 to 65535, then a path, query or fragment.
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST = r"(?:\[[0-9A-Fa-f:.]{2,45}\]|[0-9]{1,3}(?:\.[0-9]{1,3}){3}|[A-Za-z0-9.-]*[A-Za-z][A-Za-z0-9.-]*)"
URL_PATTERN = rf"^https?://{_HOST}(?::{_PORT})?(?:[/?#][^\x00\s]*)?$"


class HookRefused(UserError):
    """The endpoint is not one mxq may reach (its scheme, its host, the addresses it resolves to)."""


@dataclass(frozen=True)
class Endpoint:
    """A webhook URL, parsed and checked against the allowlist (its addresses not yet)."""

    scheme: str
    host: str
    port: int
    target: str  # the path and query, as sent

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == default else f"{name}:{self.port}"


def endpoint(url: str, allowlist: HookAllowlist) -> Endpoint:
    """`url` parsed, its host checked against MXQ_HOOK_ALLOWED_HOSTS."""
    parts, hostname, port = _parsed(url)
    _check_listed(hostname, allowlist)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Endpoint(parts.scheme, hostname, port or (443 if parts.scheme == "https" else 80), target)


def _parsed(url: str) -> tuple[SplitResult, str, int | None]:
    """`url` split, with its host and port, once it is an http(s) URL of a host without
    credentials (else the one-line reason)."""
    if len(url) > MAX_URL:
        raise HookRefused(f"a webhook URL is at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        hostname, port = parts.hostname, parts.port
    except ValueError:  # "Invalid IPv6 URL", a port that is not a number or out of range
        raise HookRefused(f"a webhook URL is https://HOST[:PORT]/PATH (PORT from 1 to 65535), "
                          f"not {url[:80]!r}") from None
    if parts.scheme not in SCHEMES or not hostname:
        raise HookRefused(f"a webhook URL is https://HOST[:PORT]/PATH or http://…, not {url[:80]!r}")
    if parts.username or parts.password:
        raise HookRefused("a webhook URL must not hold credentials: its deliveries are signed")
    if port == 0:
        raise HookRefused(f"a webhook URL's port is a number from 1 to 65535, not 0: {url[:80]!r}")
    return parts, hostname, port


def _check_listed(hostname: str, allowlist: HookAllowlist) -> None:
    """The host is in MXQ_HOOK_ALLOWED_HOSTS (an unset one allows none)."""
    if not allowlist:
        raise HookRefused("no webhook host is allowed: MXQ_HOOK_ALLOWED_HOSTS is unset; set it to "
                          "the hosts (or *.domain) your endpoints are at")
    if not allowlist.names_host(hostname):
        raise HookRefused(f"host {hostname} is not in MXQ_HOOK_ALLOWED_HOSTS")


# IPv6 networks whose addresses carry an IPv4 address (a translator or a tunnel delivers them to
# it, private ones included) or are deprecated: never public, whatever `is_global` says of them.
EMBEDS_IPV4 = tuple(ipaddress.ip_network(n) for n in (
    "::/96",             # IPv4-compatible (deprecated)
    "::ffff:0:0/96",     # IPv4-mapped
    "::ffff:0:0:0/96",   # IPv4-translated (SIIT)
    "64:ff9b::/96",      # NAT64, well-known prefix
    "64:ff9b:1::/48",    # NAT64, local use
    "2002::/16",         # 6to4
    "2001::/32",         # Teredo
    "fec0::/10",         # site-local (deprecated)
))


def _public(address: IPAddress) -> bool:
    """A global unicast address that no translator or tunnel maps onto an IPv4 address."""
    if address.version == 6 and any(address in net for net in EMBEDS_IPV4):
        return False
    return address.is_global and not address.is_multicast


def _reachable(address: IPAddress, allowlist: HookAllowlist) -> bool:
    """A public unicast address, or one a listed address or network holds."""
    return allowlist.holds(address) or _public(address)


def resolve(point: Endpoint, allowlist: HookAllowlist) -> IPAddress:
    """The address to connect to: the first the host resolves to, once every one of them passed
    (a name with one private address among public ones is refused whole)."""
    try:
        infos = socket.getaddrinfo(point.host, point.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise HookRefused(f"cannot resolve webhook host {point.host}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos))
    for address in addresses:
        if not _reachable(address, allowlist):
            raise HookRefused(f"webhook host {point.host} resolves to {address}, a private, "
                              "loopback or reserved address that MXQ_HOOK_ALLOWED_HOSTS does not "
                              "name (list the address or its network to allow it)")
    if not addresses:
        raise HookRefused(f"webhook host {point.host} resolves to no address")
    return addresses[0]


def checked(url: str, allowlist: HookAllowlist) -> tuple[Endpoint, IPAddress]:
    """Both checks: the host is listed, and its addresses may be reached."""
    point = endpoint(url, allowlist)
    return point, resolve(point, allowlist)


def endpoint_host(url: str) -> str:
    """The host of an endpoint's URL, what a log line names (never its path or query)."""
    return urlsplit(url).hostname or "?"
