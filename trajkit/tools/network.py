"""Where tools that reach the network may connect: public addresses only, unless allowed.

Every request a tool makes on the model's behalf (a page to read, an image to look at) goes out
from the runner, never from inside a sandbox, and may only reach public addresses: loopback,
private, link-local (cloud metadata services live there), carrier-grade NAT, multicast,
unspecified and reserved addresses are refused. The check is made on the addresses a name
resolves to, by the resolver the connection then uses, so the connection goes to the address that
was checked (a name that resolves to a public address when checked and to a private one a moment
later cannot slip through); names given as addresses are checked before the request. An
allow-list of ``HOST:PORT`` entries lets a run reach an intranet service or a test server.

:class:`NetworkPolicy` holds the rules and :class:`GuardedResolver` applies them to aiohttp's
connections; :mod:`trajkit.tools.fetch` builds its client on both, and anything else that opens
connections for a model (a browser's filtering proxy, an MCP client) can use them the same way.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ipaddress

    from aiohttp.abc import AbstractResolver, ResolveResult

    Address = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
"""Cloud metadata services (AWS, ECS, AWS over IPv6, Alibaba, Oracle): named as such in refusals."""


def public(url: str) -> str:
    """``url`` without user, password, query or fragment: safe for logs and messages."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


@functools.cache
def _ranges() -> dict[str, Any]:
    """The address sets the checks need, made on first use (``ipaddress`` is not imported with
    the plugins)."""
    import ipaddress

    return {
        "metadata": frozenset(ipaddress.ip_address(a) for a in METADATA),
        "nat64": ipaddress.ip_network("64:ff9b::/96"),
        "shared": ipaddress.ip_network("100.64.0.0/10"),
    }


class Refused(Exception):
    """A request the network policy does not let through; the message says what and why."""


def address_problem(address: Address) -> str | None:
    """Why ``address`` may not be reached by a tool ("a loopback address"), or None for a public one.

    IPv6 forms that carry an IPv4 address (mapped, 6to4, Teredo, NAT64) are judged by the address
    they carry.
    """
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return address_problem(embedded)
    if address in _ranges()["metadata"]:
        return "a cloud metadata address"
    for check, kind in (
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_unspecified", "an unspecified address"),
    ):
        if getattr(address, check):
            return kind
    if address.version == 4 and address in _ranges()["shared"]:
        return "a carrier-grade NAT address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "a reserved address"
    return None


def _embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    import ipaddress

    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _ranges()["nat64"]:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def parse_address(host: str) -> Address | None:
    """``host`` as an IP address (brackets and an IPv6 zone allowed), or None for a name."""
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return None


def parse_host_port(entry: str) -> tuple[str, int]:
    """``"example.org:8080"``, ``"10.0.0.5:443"`` or ``"[::1]:8000"`` -> (host, port); a
    :class:`ValueError` saying what is wrong."""
    text = entry.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r} is not HOST:PORT (e.g. intranet.example:8080 or [::1]:8000)")
    if host.startswith("["):
        if not host.endswith("]") or parse_address(host) is None:
            raise ValueError(f"{entry!r}: an IPv6 address goes in brackets, e.g. [::1]:8000")
    elif ":" in host:
        raise ValueError(f"{entry!r}: an IPv6 address goes in brackets, e.g. [::1]:8000")
    return _normal_host(host), int(port)


def _normal_host(host: str) -> str:
    address = parse_address(host)
    return str(address) if address is not None else host.lower().rstrip(".")


@dataclass(frozen=True)
class NetworkPolicy:
    """Which hosts a tool's connections may reach."""

    allow: frozenset[tuple[str, int]] = frozenset()
    """(host, port) pairs reachable whatever their address: a name (then every address it
    resolves to) or an address (then that address under any name)."""
    guard: bool = True
    """False for endpoints the run's configuration names (a search API, a model endpoint): they
    may be anywhere, an intranet or this machine included."""
    hint: str = ""
    """Appended to every refusal: how the operator lets a host through (the setting's name)."""

    @classmethod
    def allowing(cls, entries: Iterable[str], hint: str = "") -> NetworkPolicy:
        return cls(frozenset(parse_host_port(entry) for entry in entries), hint=hint)

    def allowed(self, host: str, port: int) -> bool:
        return not self.guard or (_normal_host(host), port) in self.allow

    def check_host(self, host: str, port: int) -> None:
        """Refuse ``host`` when it is an address the policy does not let through (names are
        checked when they are resolved, by :class:`GuardedResolver`)."""
        address = parse_address(host)
        if address is None or self.allowed(host, port):
            return
        problem = address_problem(address)
        if problem is not None:
            raise Refused(f"{host} is {problem}{self.hint}")

    def check_resolved(self, host: str, port: int, found: list[ResolveResult]) -> list[ResolveResult]:
        """The addresses ``host`` resolved to that may be reached; :class:`Refused` when none may."""
        if self.allowed(host, port):
            return found
        kept, problems = [], []
        for result in found:
            address = parse_address(result["host"])
            problem = "not an IP address" if address is None else address_problem(address)
            if problem is None or self.allowed(result["host"], port):
                kept.append(result)
            else:
                problems.append(f"{result['host']}, {problem}")
        if not kept:
            shown = "; ".join(problems) or "no address"
            raise Refused(f"{host} resolves to {shown}{self.hint}")
        return kept


class GuardedResolver:
    """An aiohttp resolver (``aiohttp.abc.AbstractResolver``'s interface) that hands the connector
    only the addresses the policy lets through.

    It wraps another resolver (aiohttp's default unless given), so the connection is made to one
    of the very addresses that were checked. It does not subclass aiohttp's class, so that loading
    the plugins that use it does not import aiohttp.
    """

    def __init__(self, policy: NetworkPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if self.inner is None:
            from aiohttp.resolver import DefaultResolver

            self.inner = DefaultResolver()
        found = await self.inner.resolve(host, port, family)
        return self.policy.check_resolved(host, port, found)

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()
