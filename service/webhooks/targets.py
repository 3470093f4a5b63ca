"""Server-side request forgery: which webhook targets may be reached.

A URL is https (http only where the operator allows private targets), and every address its
host resolves to is public: loopback, private, link-local, multicast, reserved, unspecified and
shared ranges are refused, in IPv4 and IPv6, including IPv4 embedded in IPv6 (mapped, 6to4,
NAT64). Checked at creation and again at every send, where the request then goes to the very
address that was checked (a DNS answer that changes between check and connect, DNS rebinding,
reaches nothing new). A name that does not resolve is refused exactly as a private one
(`_not_public`): the refusal is no oracle for the operator's internal DNS.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class TargetRefused(ValueError):
    """The URL or one of its addresses may not be reached."""


@dataclass(frozen=True)
class Target:
    url: httpx.URL
    address: str  # the checked address the request connects to


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and (v4 := _embedded_v4(ip)) is not None:
        return is_public(v4)
    special = (
        ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_multicast
        or ip.is_reserved or ip.is_unspecified
    )  # fmt: skip
    return ip.is_global and not special


def parse(url: str, allow_private: bool) -> httpx.URL:
    """The URL, if its form is acceptable (scheme, host, no credentials)."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise TargetRefused(f"not a valid URL: {exc}") from None
    schemes = ("https", "http") if allow_private else ("https",)
    if parsed.scheme not in schemes:
        raise TargetRefused("must be an https URL")
    if not parsed.host:
        raise TargetRefused("must name a host")
    if parsed.userinfo:
        raise TargetRefused("must not carry credentials")
    return parsed


def _not_public(host: str) -> TargetRefused:
    """The one refusal of a host, whether its name does not resolve, resolves to no address or
    to one that is not public: telling them apart would let a tenant probe the operator's
    internal DNS (which names exist inside). It names the host as the caller wrote it, never
    an address a name resolved to."""
    return TargetRefused(
        f"host '{host}' is not a public address (it does not resolve, or resolves to a "
        "loopback, private, link-local or other non-public address): refused unless the "
        "operator allows private targets"
    )


def addresses(host: str, port: int) -> list[IPAddress]:
    """The host's addresses; none for a name that does not resolve."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    # scope ids (fe80::1%eth0) are cut before parsing; the address itself is what is judged
    return list(dict.fromkeys(ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos))


def resolve(url: str, allow_private: bool) -> Target:
    """The URL and the address to connect to; TargetRefused when any address is not public
    (unless allowed): one private answer among public ones is refused too."""
    parsed = parse(url, allow_private)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    found = addresses(parsed.host, port)
    if not allow_private and not (found and all(is_public(ip) for ip in found)):
        raise _not_public(parsed.host)
    if not found:  # private targets allowed: any name may be reached, nothing to hide
        raise TargetRefused(f"host '{parsed.host}' does not resolve")
    return Target(url=parsed, address=str(found[0]))
