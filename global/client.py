"""Where a client is: its address (the peer, or X-Forwarded-For walked from the right past
trusted proxies, gpuroute/forwarded.py), then GeoIP. Anything that cannot be placed
(private, loopback or malformed addresses, addresses the database does not know, no
database) is unplaced, not an error: the policy then ranks by load and
`residency.unknown_country` decides what is allowed."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import geoip2.database
import geoip2.errors
from gpuroute.global_.core.geo import Point

from gpuroute.forwarded import TrustedProxies, parse_hop

log = logging.getLogger("gpuroute.global.client")


@dataclass(frozen=True, slots=True)
class ClientPlace:
    address: str | None
    location: Point | None = None
    country: str | None = None  # ISO 3166 alpha-2
    why_unplaced: str | None = None


class ClientLocator:
    def __init__(self, database: str | None, trusted_proxies: list[str]) -> None:
        self.proxies = TrustedProxies(trusted_proxies)
        self.reader = None
        if database is not None:
            self.reader = geoip2.database.Reader(database)
            log.info("GeoIP database %s (%s)", database, self.reader.metadata().database_type)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()

    def trusted(self, address: str | None) -> bool:
        return self.proxies.trusts(address)

    def place(self, peer: str | None, forwarded_for: str | None = None) -> ClientPlace:
        address = self.proxies.client_address(peer, forwarded_for)
        ip = parse_hop(address)
        if ip is None:
            return ClientPlace(address, why_unplaced="not an IP address")
        if not ip.is_global:
            return ClientPlace(address, why_unplaced="private or reserved address")
        if self.reader is None:
            return ClientPlace(address, why_unplaced="no GeoIP database configured")
        try:
            city = self.reader.city(str(ip))
        except geoip2.errors.AddressNotFoundError:
            return ClientPlace(address, why_unplaced="address not in the GeoIP database")
        except (TypeError, ValueError) as exc:  # a Country database, or a corrupt one
            return ClientPlace(address, why_unplaced=f"GeoIP lookup failed: {exc}")
        lat, lon = city.location.latitude, city.location.longitude
        location = Point(lat, lon) if lat is not None and lon is not None else None
        return ClientPlace(address, location, city.country.iso_code)
