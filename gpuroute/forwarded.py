"""Who the client is, behind proxies: both tiers walk X-Forwarded-For the same way.

A client can write anything into the header; only proxies append to it. So the chain (its
entries, then the peer that sent the request) is read from the right, past every proxy the
operator trusts, and the first hop not trusted is the client. Entries may carry a port
(`203.0.113.7:5123`, `[2001:db8::1]:443`), as some proxies write them; an entry that is no
address at all makes the client unplaceable, never someone else."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_hop(entry: str | None) -> IpAddress | None:
    """An X-Forwarded-For entry (or a peer address) as an IP, with any port or brackets
    dropped and IPv4-mapped IPv6 read as IPv4; None when it is no address."""
    if not entry:
        return None
    text = entry.strip().strip('"')
    port: str | None = None
    if text.startswith("["):  # [v6] or [v6]:port
        text, _, rest = text[1:].partition("]")
        if rest:
            port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:  # v4:port (a bare v6 address has several colons)
        text, _, port = text.partition(":")
    if port is not None and not (port.isdigit() and int(port) < 65536):
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def client_key(address: str) -> str:
    """What per-client limits count: an IPv4 address, or an IPv6 address's /64 (a host
    gets a whole /64 and can rotate through it at will)."""
    ip = parse_hop(address)
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return address if ip is None else str(ip)


class TrustedProxies:
    """The networks whose X-Forwarded-For entries (and `x-gpuroute-tenant`) count."""

    def __init__(self, cidrs: Iterable[str]) -> None:
        self.networks = [ipaddress.ip_network(c, strict=False) for c in cidrs]

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: str | None) -> bool:
        ip = parse_hop(address)
        return ip is not None and any(ip in net for net in self.networks)

    def client_address(self, peer: str | None, forwarded_for: str | None) -> str | None:
        """The client: the peer itself unless it is a trusted proxy; else the last entry
        not trusted, walking X-Forwarded-For from the right (the leftmost when every
        entry is trusted). An address is given without its port."""
        address = peer
        if forwarded_for and self.trusts(peer):
            for hop in reversed([h for h in forwarded_for.split(",") if h.strip()]):
                address = hop
                if not self.trusts(hop):
                    break
        ip = parse_hop(address)
        return str(ip) if ip is not None else (address.strip() if address else None)
