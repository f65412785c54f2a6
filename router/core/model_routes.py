"""Which model serves a request (sans-IO): aliases, weighted splits between versions and
fallback chains, resolved once per request before the scheduler places it.

A split is sticky: a request's version is drawn from a hash of its session (its request id
without one) and the model's name, against the versions' cumulative weights. The same
session always lands in the same bucket, and moving weight between versions moves only
the sessions whose bucket changes hands: a canary going from 5 % to 10 % keeps every
session it had. Changing weights (`set_split`) takes effect on the next request."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SPLIT_TOTAL = 100.0  # weights are percentages


class ModelRouteError(ValueError):
    """A route table that cannot be used: a loop of aliases, weights that do not add up."""


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A model name clients ask for: the versions it splits into (served names with
    percentages, in order) and the models it may fall back to, lightest-suitable first."""

    name: str
    split: tuple[tuple[str, float], ...] = ()
    fallback: tuple[str, ...] = ()

    def version(self, bucket: float) -> str:
        """The version whose share of [0, 1) holds `bucket` (the name itself without a split)."""
        edge = 0.0
        for served, weight in self.split:
            edge += weight / SPLIT_TOTAL
            if bucket < edge and weight > 0:
                return served
        live = [served for served, weight in self.split if weight > 0]
        return live[-1] if live else self.name


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """What a request asked for and what may serve it, in order of preference."""

    requested: str
    name: str  # after aliases
    chain: tuple[str, ...]  # the version to serve first, then its fallbacks

    @property
    def model(self) -> str:
        return self.chain[0]

    @property
    def fallbacks(self) -> tuple[str, ...]:
        return self.chain[1:]


def split_bucket(model: str, key: str) -> float:
    """A stable point in [0, 1) for (model, session): the same on every replica and restart."""
    digest = hashlib.blake2b(f"{model}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def split_problem(pairs: tuple[tuple[str, float], ...]) -> str | None:
    """What is wrong with a split (negative weights, a sum other than 100, a version twice),
    or None (the config's check and the table's say it alike)."""
    if any(weight < 0 for _, weight in pairs):
        return "split weights must be >= 0"
    total = sum(weight for _, weight in pairs)
    if pairs and abs(total - SPLIT_TOTAL) > 1e-6:
        return f"split weights add up to {total:g}, not 100"
    if len({served for served, _ in pairs}) != len(pairs):
        return "a version appears twice in its split"
    return None


def check_split(name: str, split: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """The split as a tuple, or ModelRouteError naming the model and what is wrong."""
    pairs = tuple(split)
    problem = split_problem(pairs)
    if problem is not None:
        raise ModelRouteError(f"model {name!r}: {problem}")
    return pairs


class ModelRoutes:
    """The router's table of aliases, splits and fallbacks. Names it does not know resolve
    to themselves, so a fleet with no [[models]] routes exactly as before."""

    def __init__(self, routes: Iterable[ModelRoute] = (), aliases: Mapping[str, str] = ()):
        self.routes = {r.name: r for r in routes}
        self.aliases = dict(aliases)
        for route in self.routes.values():
            check_split(route.name, route.split)
        for alias in self.aliases:
            self.alias_target(alias)  # raises on a loop

    def alias_target(self, name: str) -> str:
        """Follow aliases to a name that is none; ModelRouteError on a loop."""
        seen = [name]
        while name in self.aliases:
            name = self.aliases[name]
            if name in seen:
                loop = " → ".join([*seen, name])
                raise ModelRouteError(f"alias loop: {loop}")
            seen.append(name)
        return name

    def resolve(self, requested: str, sticky_key: str, *, fallback: bool = True) -> ModelChoice:
        """The model chain for one request: alias followed, version drawn, then (unless
        `fallback` is off) each fallback's own version for the same session."""
        name = self.alias_target(requested)
        chain = [self._version(name, sticky_key)]
        route = self.routes.get(name)
        if fallback and route is not None:
            for other in route.fallback:
                served = self._version(self.alias_target(other), sticky_key)
                if served not in chain:
                    chain.append(served)
        return ModelChoice(requested, name, tuple(chain))

    def _version(self, name: str, sticky_key: str) -> str:
        route = self.routes.get(name)
        if route is None or not route.split:
            return name
        return route.version(split_bucket(name, sticky_key))

    def names(self) -> frozenset[str]:
        """Every name a client may ask for besides the served ones: aliases and routes."""
        return frozenset(self.aliases) | frozenset(self.routes)

    def reachable(self, served: Iterable[str]) -> frozenset[str]:
        """The aliases and routed names a request may name and be answered by one of the
        `served` models: one of its versions with weight, or one of its fallbacks' (what
        a region tells the global tier it serves, beside `served` itself)."""
        served = frozenset(served)
        return frozenset(n for n in self.names() if served.intersection(self._chain(n)))

    def _chain(self, name: str) -> set[str]:
        """Every model a request for `name` may be served by, whatever its session."""
        target = self.alias_target(name)
        route = self.routes.get(target)
        if route is None:
            return {target}
        models = self._versions(route)
        for other in route.fallback:
            fallback = self.routes.get(self.alias_target(other))
            models |= {self.alias_target(other)} if fallback is None else self._versions(fallback)
        return models

    @staticmethod
    def _versions(route: ModelRoute) -> set[str]:
        return {served for served, weight in route.split if weight > 0} or {route.name}

    def permits(self, allowed: frozenset[str] | None, model: str) -> bool:
        """Whether a key that may use `allowed` (names or aliases; None: anything) may be
        served by `model`, a name or a split's version: an entry stands for the model it
        names after aliases and for that model's versions, never for a fallback."""
        if allowed is None:
            return True
        names = {self.alias_target(name) for name in allowed}
        if self.alias_target(model) in names:
            return True
        return any(
            route.name in names and model in dict(route.split) for route in self.routes.values()
        )

    def may_serve(self, allowed: frozenset[str] | None, requested: str) -> bool:
        """Whether a request for `requested` may be served under a key that may use
        `allowed` for some session (a split draws the version by session): `permits`
        before the session is known, as for a request refused before work done for it."""
        if allowed is None:
            return True
        name = self.alias_target(requested)
        route = self.routes.get(name)
        first = {name} if route is None else self._versions(route)
        return any(self.permits(allowed, model) for model in first)

    def set_split(self, name: str, split: Iterable[tuple[str, float]]) -> ModelRoute:
        """New weights for `name`'s versions, from the next request on (the admin API)."""
        route = self.routes.get(name)
        if route is None:
            raise ModelRouteError(f"model {name!r} has no route to split")
        pairs = check_split(name, split)
        known = {served for served, _ in route.split}
        unknown = sorted({served for served, _ in pairs} - known)
        if unknown:
            raise ModelRouteError(f"model {name!r}: {unknown} are not among its versions")
        self.routes[name] = new = ModelRoute(name, pairs, route.fallback)
        return new
