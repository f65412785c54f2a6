"""Data residency as a hard filter that fails closed (pure).

Three kinds of rule each name the jurisdictions a request may be served in: per tenant, per
client country, and the `x-gpuroute-residency` header. A request's allowed set is the
intersection of every rule that applies to it; an empty intersection is a refusal that
names the rules. No spillover, failover or retry path ever sees a region outside the set:
the policy only ranks regions this module let through."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ANY = frozenset({"*"})
ECHOED = 80  # characters of a client's header an error repeats


class ResidencyError(ValueError):
    """A request's residency value is malformed or unknown (answered with 400)."""


@dataclass(frozen=True, slots=True)
class Allowed:
    jurisdictions: frozenset[str]  # ANY = no rule applied
    rules: tuple[str, ...] = ()  # the rules that applied, for errors and logs

    def permits(self, jurisdiction: str) -> bool:
        return self.jurisdictions is ANY or jurisdiction in self.jurisdictions

    @property
    def empty(self) -> bool:
        return not self.jurisdictions


@dataclass(frozen=True)
class ResidencyRules:
    """Compiled rules. `jurisdictions` are those the fleet's regions have; a rule naming
    any other is a config error (see `check`)."""

    jurisdictions: frozenset[str]
    tenants: Mapping[str, frozenset[str]] = field(default_factory=dict)
    countries: Mapping[str, frozenset[str]] = field(default_factory=dict)
    unknown_country: frozenset[str] = ANY  # when GeoIP cannot place the client

    def check(self) -> list[str]:
        """Problems with the rules themselves, as `key: message` lines."""
        problems = []
        for kind, table in (("tenants", self.tenants), ("countries", self.countries)):
            for key, allowed in table.items():
                problems += [
                    f"residency.{kind}.{key}: unknown jurisdiction {j!r}"
                    for j in sorted(allowed - self.jurisdictions)
                ]
                if not allowed:
                    problems.append(f"residency.{kind}.{key}: empty list (would refuse all)")
        for j in sorted(self.unknown_country - self.jurisdictions - ANY):
            problems.append(f"residency.unknown_country: unknown jurisdiction {j!r}")
        for code in self.countries:
            if len(code) != 2 or not code.isalpha() or not code.isupper():
                problems.append(f"residency.countries.{code}: use ISO 3166 alpha-2, e.g. DE")
        return problems

    def allowed(
        self, *, tenant: str | None = None, header: str | None = None, country: str | None = None
    ) -> Allowed:
        """The jurisdictions a request may be served in. Raises ResidencyError for a header
        naming no known jurisdiction (a typo must not silently mean "anywhere")."""
        sets: list[frozenset[str]] = []
        rules: list[str] = []
        if tenant is not None and tenant in self.tenants:
            sets.append(self.tenants[tenant])
            rules.append(f"tenant {tenant}")
        if header is not None:
            wanted = frozenset(v.strip().lower() for v in header.split(",") if v.strip())
            if not wanted or not wanted <= self.jurisdictions:
                known = ", ".join(sorted(self.jurisdictions))
                shown = header if len(header) <= ECHOED else header[: ECHOED - 3] + "..."
                raise ResidencyError(
                    f"x-gpuroute-residency {shown!r}: unknown jurisdiction; known: {known}"
                )
            sets.append(wanted)
            rules.append(f"header {','.join(sorted(wanted))}")
        if country is not None and country in self.countries:
            sets.append(self.countries[country])
            rules.append(f"country {country}")
        elif country is None and self.unknown_country is not ANY:
            sets.append(self.unknown_country)
            rules.append("unknown country")
        return Allowed(intersect(sets), tuple(rules))


def intersect(sets: Iterable[frozenset[str]]) -> frozenset[str]:
    result = ANY
    for s in sets:
        result = s if result is ANY else result & s
    return result
