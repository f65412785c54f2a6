"""The global routing decision (pure: the caller passes the region views and `rng`).

1. Residency: only regions whose jurisdiction the request's rules allow, and that serve
   its model, are ever looked at. None left: a refusal that names its true reason, in
   this order: `residency` when the rules leave no jurisdiction, `model_not_found` when no
   region knows the model at all, `residency` when only regions the rules forbid know it,
   `region_unavailable` when allowed regions that serve it are all down, and `no_backend`
   when allowed regions know it but have no engine for it in rotation.
2. Of those, the regions that are up. None up: `region_unavailable` (the caller answers 503).
3. Rank: `nearest` by distance; `latency` and `ours` by estimated RTT plus the region's
   expected queueing delay.
4. `ours` then walks the ranking: each region keeps a request unless it is spilling, in
   which case the request moves on with the spill fraction's probability to the next
   region that can receive. A region hint header wins when it is compliant and up.

The decision carries the full compliant, up ranking after the chosen region: the caller
retries across regions (before the first byte) in that order and no other."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpuroute.global_.core.geo import Point, estimated_rtt_s, great_circle_km
from gpuroute.global_.core.residency import Allowed
from gpuroute.global_.core.spillover import Spillover

MODES = ("ours", "latency", "nearest")


@dataclass(frozen=True, slots=True)
class RegionView:
    name: str
    jurisdiction: str
    location: Point
    up: bool
    queue_delay_s: float = 0.0
    models: frozenset[str] | None = None  # None: not reported yet, assume it serves all
    # the models its router knows (declared, or listed by any backend in any state), served
    # now or not; None: not reported (a router before the field), taken to be `models`
    known: frozenset[str] | None = None

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    def knows(self, model: str) -> bool:
        return self.serves(model) or (self.known is not None and model in self.known)


@dataclass(frozen=True, slots=True)
class GlobalRequest:
    model: str
    allowed: Allowed
    location: Point | None = None  # None: client not placed; rank by region order
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class GlobalDecision:
    order: tuple[str, ...]  # chosen region first, then the retry order; empty = refused
    # placed: nearest | latency | spill | failover | hint; refused: residency |
    # model_not_found | region_unavailable | no_backend (GlobalPolicy._refusal)
    reason: str
    rules: tuple[str, ...] = ()

    @property
    def region(self) -> str | None:
        return self.order[0] if self.order else None


class GlobalPolicy:
    def __init__(self, mode: str = "ours", spillover: Spillover | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown global policy {mode!r}; known: {', '.join(MODES)}")
        self.mode = mode
        self.spillover = spillover or Spillover()

    def decide(
        self, request: GlobalRequest, regions: Sequence[RegionView], rng: random.Random
    ) -> GlobalDecision:
        allowed = request.allowed
        compliant = [r for r in regions if allowed.permits(r.jurisdiction)]
        serving = [r for r in compliant if r.serves(request.model)]
        up = [r for r in serving if r.up]
        if not up:
            return GlobalDecision((), self._refusal(request, regions, serving), allowed.rules)
        key = self._key(request.location)
        ranked = up if key is None else sorted(up, key=key)
        if request.hint is not None:
            hinted = next((r for r in ranked if r.name == request.hint), None)
            if hinted is not None:
                rest = tuple(r.name for r in ranked if r is not hinted)
                return GlobalDecision((hinted.name, *rest), "hint", allowed.rules)
        first = 0
        if self.mode == "ours":
            first = self._walk(ranked, rng)
        chosen = ranked[first]
        order = (chosen.name, *(r.name for r in ranked if r is not chosen))
        # failover: the region this client would have had is down (only when some are)
        best = None
        if len(serving) > len(up):
            best = serving[0] if key is None else min(serving, key=key)
        if best is not None and not best.up and first == 0:
            reason = "failover"
        elif first > 0:
            reason = "spill"
        else:
            reason = "nearest" if self.mode == "nearest" else "latency"
        return GlobalDecision(order, reason, allowed.rules)

    @staticmethod
    def _refusal(
        request: GlobalRequest, regions: Sequence[RegionView], serving: Sequence[RegionView]
    ) -> str:
        """Why no region is left: residency only when the rules are what rules out every
        region that could serve the model (see the module's docstring for the order)."""
        allowed, model = request.allowed, request.model
        if allowed.empty:
            return "residency"
        knowing = [r for r in regions if r.knows(model)]
        if not knowing:
            return "model_not_found"
        if not any(allowed.permits(r.jurisdiction) for r in knowing):
            return "residency"
        return "region_unavailable" if serving else "no_backend"

    def _key(self, location: Point | None):
        """What regions are ranked by (None: keep the configured order)."""
        if self.mode == "nearest":
            if location is None:
                return None
            return lambda r: great_circle_km(location, r.location)
        if location is None:
            return lambda r: r.queue_delay_s
        return lambda r: estimated_rtt_s(location, r.location) + r.queue_delay_s

    def _walk(self, ranked: Sequence[RegionView], rng: random.Random) -> int:
        """Index of the region that keeps the request (the spill waterfall)."""
        spill = self.spillover
        i = 0
        while True:
            fraction = spill.fraction(ranked[i].name)
            if fraction <= 0 or rng.random() >= fraction:
                return i
            nxt = next(
                (j for j in range(i + 1, len(ranked)) if spill.can_receive(ranked[j].name)), None
            )
            if nxt is None:
                return i  # nobody can absorb it: it stays (and queues) here
            i = nxt
