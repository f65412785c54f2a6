"""LoRA adapter affinity, the SLO filter's next stage in `slo_aware` (issue 32).

An engine's batch mixes only as many adapters as it has slots (vLLM's `--max-loras`);
one that is not in a slot waits for one to free and for the adapter to load. Spreading an
adapter's requests over every backend makes each engine load and evict adapters all the
time, so each adapter keeps to a small, stable set of backends, its home set: the first
`width` of the routable backends in rendezvous-hash order of (adapter, backend id). The
order is the same in every router replica and changes little when backends come and go.

SLO first, affinity second: this stage only narrows what the SLO filter kept. Among those
fits, a home backend has room for the request when
- the adapter is running there, or it has a free slot (or its slots are unknown), and
- its predicted TTFT is within `headroom` of the class's TTFT (the rest absorbs the
  load time and prediction errors, so a home set is not packed up to the SLO's edge).
The request goes, in this order of preference, to a home backend with room where the
adapter runs, to one with a free slot (which loads it), or to a backend outside the home
set where it still runs (it stays loaded there while the width shrinks); the policy's
score picks among them. When none has room the width grows to the first backend in
rendezvous order that has; when no backend has room (every slot is taken), the fits where
the adapter runs stay (no new slot), else its first fit in rendezvous order: spreading it
then would only make more engines wait for slots. A width shrinks by one for each
`shrink_after_s` in which it did not have to grow: the load that needed it is gone."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuroute.router.core.backend import Backend, BackendSet
from gpuroute.router.core.latency import Prediction
from gpuroute.router.core.policies.base import PickContext, check


def rendezvous_key(adapter: str, backend_id: str) -> int:
    """Highest-random-weight hash of the pair: stable across processes and restarts."""
    digest = hashlib.blake2b(f"{adapter}\0{backend_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, slots=True)
class AdapterAffinityConfig:
    width: int = 1  # backends in an adapter's home set while it is quiet
    headroom: float = 0.5  # a home backend has room while predicted TTFT <= this x the SLO's
    shrink_after_s: float = 30.0  # a grown width shrinks by one per quiet period this long

    def __post_init__(self) -> None:
        check(self.width >= 1, "width", "must be >= 1")
        check(0 < self.headroom <= 1, "headroom", "must be in (0, 1]")
        check(self.shrink_after_s > 0, "shrink_after_s", "must be > 0")


class AdapterAffinity:
    """Each adapter's home width (grown under load, shrunk when idle) and home sets; as a
    filter plug-in (`keep`), it narrows the SLO filter's fits to the adapter's home set."""

    name: ClassVar[str] = "adapter_affinity"

    def __init__(self, config: AdapterAffinityConfig = AdapterAffinityConfig()) -> None:
        self.base_width = config.width
        self.headroom = config.headroom
        self.shrink_after_s = config.shrink_after_s
        self._widths: dict[str, tuple[int, float]] = {}  # adapter → (width, since when)
        self._orders: dict[tuple[str, str], tuple[int, list[str]]] = {}

    def order(self, backends: BackendSet, model: str, adapter: str) -> list[str]:
        """Routable backends of `model` in the adapter's rendezvous order (cached until the
        set changes)."""
        key = (model, adapter)
        cached = self._orders.get(key)
        if cached is None or cached[0] != backends.version:
            ids = [b.backend_id for b in backends.routable(model)]
            ids.sort(key=lambda i: rendezvous_key(adapter, i), reverse=True)
            cached = self._orders[key] = (backends.version, ids)
        return cached[1]

    def width(self, adapter: str, now: float) -> int:
        """The adapter's home width now (after shrinking for the quiet periods)."""
        width, since = self._widths.get(adapter, (self.base_width, now))
        quiet = int((now - since) // self.shrink_after_s)
        if quiet > 0 and width > self.base_width:
            width = max(self.base_width, width - quiet)
            since += quiet * self.shrink_after_s
        self._widths[adapter] = (width, since)
        return width

    def home(self, ctx: PickContext, candidates: Sequence[Backend]) -> list[Backend]:
        """The candidates in the request's adapter's home set, or where it runs (for a
        large pool's sampler to consider besides its sample)."""
        adapter = ctx.request.adapter
        if adapter is None:
            return []
        order = self.order(ctx.backends, ctx.request.model, adapter)
        home = set(order[: self.width(adapter, ctx.now)])
        return [b for b in candidates if b.backend_id in home or adapter in b.adapters]

    def keep(
        self, ctx: PickContext, fits: dict[Backend, Prediction]
    ) -> tuple[dict[Backend, Prediction], None]:
        """The filter stage: never empty where `fits` is not, so it names no nearest."""
        return self.narrow(ctx, fits), None

    def narrow(
        self, ctx: PickContext, fits: dict[Backend, Prediction]
    ) -> dict[Backend, Prediction]:
        """The fits the request's adapter may go to (module docstring); all of them for a
        request naming no adapter."""
        adapter = ctx.request.adapter
        if adapter is None or not fits:
            return fits
        order = self.order(ctx.backends, ctx.request.model, adapter)
        rank = {backend_id: i for i, backend_id in enumerate(order)}
        width = self.width(adapter, ctx.now)
        bound = self.headroom * ctx.slo.ttft_s
        room = {b: p for b, p in fits.items() if takes(b, adapter) and p.ttft_s <= bound}
        home = {b: p for b, p in room.items() if rank.get(b.backend_id, width) < width}
        running = {b: p for b, p in room.items() if adapter in b.adapters}
        # where it runs at home, else a free slot at home, else where it runs elsewhere
        kept = {b: p for b, p in home.items() if b in running} or home or running
        if not kept and room:  # grow the home set to the first backend with room
            first = min(room, key=lambda b: rank.get(b.backend_id, len(order)))
            if first.backend_id in rank:
                width = rank[first.backend_id] + 1
                self._widths[adapter] = (width, ctx.now)
                kept = {first: room[first]}
        if not kept:  # no backend has room: where it runs, else its first fit in order
            kept = {b: p for b, p in fits.items() if adapter in b.adapters}
            if not kept:
                first = min(fits, key=lambda b: rank.get(b.backend_id, len(order)))
                kept = {first: fits[first]}
        if ctx.trace is not None:
            self._trace(ctx, fits, kept, rank, width, bound)
        return kept

    def _trace(
        self,
        ctx: PickContext,
        fits: dict[Backend, Prediction],
        kept: dict[Backend, Prediction],
        rank: dict[str, int],
        width: int,
        bound: float,
    ) -> None:
        """Each fit's standing with the adapter, in the decision log's words."""
        assert ctx.trace is not None and ctx.request.adapter is not None
        adapter = ctx.request.adapter
        for b, p in fits.items():
            r = rank.get(b.backend_id)
            where = f"rank {r + 1} of home width {width}" if r is not None else "unranked"
            if not takes(b, adapter):
                why = f"no free adapter slot ({len(b.adapters)}/{b.adapter_slots} in use)"
            elif p.ttft_s > bound:
                why = f"no room: predicted TTFT {p.ttft_s:.3f} s > {bound:.3f} s"
            else:
                why = "running there" if adapter in b.adapters else "a slot is free"
            verdict = "kept" if b in kept else "dropped"
            ctx.trace.row(b)["adapter"] = f"{verdict}: {where}; {why}"


def takes(backend: Backend, adapter: str) -> bool:
    """Whether `adapter` runs there or a slot is free (or the slots are unknown)."""
    slots = backend.adapter_slots
    return not slots or adapter in backend.adapters or len(backend.adapters) < slots
