"""LoRA adapters in the simulator: the scenario's `[lora]` section, each request's adapter,
and an engine whose batch can mix only `max_loras` distinct adapters (vLLM's `--max-loras`).

vLLM serves each adapter under its own model name. An adapter must sit in one of the
engine's `max_loras` GPU slots for its requests to run; a request whose adapter is not in
a slot waits until one can be freed (an adapter with no request left, least recently used
first, as vLLM's LRU adapter cache evicts) and then for the adapter to load. Routing an
adapter everywhere makes every engine load and evict adapters all the time; this model is
what counts that thrash.

Model (docs/simulator.md): a slot is held by an adapter from its load until its last
request in the engine (queued, prefilling or decoding) ends; the load delays the requests
waiting for it by `load_s` and does not stall the running batch; requests that wait for a
slot are served first come, first served, but one whose adapter is already in a slot
passes them (vLLM's scheduler skips a request whose adapter cannot be scheduled)."""

from __future__ import annotations

import heapq
import random
from collections import Counter, OrderedDict, deque

from gpuroute.sim.engine_model import EngineModel, EngineRequest
from pydantic import Field

from gpuroute.config import StrictModel
from gpuroute.roofline import EngineParams

# vLLM's default `--max-loras` (vllm/config/lora.py)
VLLM_MAX_LORAS = 1
# An assumption, not a measurement: a rank-16 adapter of an 8B model is tens of MB, a copy
# from vLLM's CPU adapter cache takes milliseconds, a first load from disk hundreds.
DEFAULT_LOAD_S = 0.1


class LoraSection(StrictModel):
    """`[lora]`: requests spread over `adapters` adapter names with Zipf-like popularity
    (adapter k's share ∝ 1 / (k + 1) ** skew), served by engines with `max_loras` slots."""

    adapters: int = Field(ge=1, le=100_000)
    skew: float = Field(default=1.0, ge=0)
    max_loras: int = Field(default=VLLM_MAX_LORAS, ge=1, le=1024)
    load_s: float = Field(default=DEFAULT_LOAD_S, ge=0)
    # share of requests for the base model itself (no adapter)
    base_share: float = Field(default=0.0, ge=0, lt=1)


def adapter_name(k: int) -> str:
    return f"lora-{k}"


def assign_adapters(n: int, lora: LoraSection | None, seed: int) -> list[str | None]:
    """Each request's adapter (None: the base model), drawn by popularity (deterministic)."""
    if lora is None:
        return [None] * n
    rng = random.Random(seed ^ 0x10AA)
    names: list[str | None] = [adapter_name(k) for k in range(lora.adapters)]
    weights = [(k + 1) ** -lora.skew for k in range(lora.adapters)]
    if lora.base_share > 0:
        total = sum(weights)
        names.append(None)
        weights.append(total * lora.base_share / (1 - lora.base_share))
    return rng.choices(names, weights=weights, k=n)


class AdapterSlots:
    """An engine's `slots` adapter slots: which adapter holds each, LRU, and the loads."""

    def __init__(self, slots: int, load_s: float) -> None:
        self.slots = slots
        self.load_s = load_s
        self.resident: OrderedDict[str, float] = OrderedDict()  # adapter → ready at; LRU first
        self.users: Counter[str] = Counter()  # requests holding each adapter's slot
        self.loads = 0

    def acquire(self, adapter: str, now: float) -> float | None:
        """A request of `adapter` takes its slot: when the adapter is usable (now, or when
        its load ends), or None when every slot is held by an adapter in use."""
        ready = self.resident.get(adapter)
        if ready is None:
            if len(self.resident) >= self.slots:
                victim = next((a for a in self.resident if not self.users[a]), None)
                if victim is None:
                    return None
                del self.resident[victim]
                del self.users[victim]
            ready = self.resident[adapter] = now + self.load_s
            self.loads += 1
        self.resident.move_to_end(adapter)
        self.users[adapter] += 1
        return ready

    def release(self, adapter: str) -> None:
        """One of its requests left the engine (its slot may now be evicted)."""
        self.users[adapter] -= 1

    def clear(self) -> None:
        self.resident.clear()
        self.users.clear()


class LoraEngine(EngineModel):
    """An EngineModel whose requests may name an adapter, gated by its adapter slots."""

    def __init__(self, params: EngineParams, lora: LoraSection, **options: bool) -> None:
        super().__init__(params, **options)
        self.slots = AdapterSlots(lora.max_loras, lora.load_s)
        self.loading: list[tuple[float, int, EngineRequest]] = []  # until their adapter loads
        self.blocked: deque[EngineRequest] = deque()  # waiting for a slot
        self.residency_changed = True  # the router's view of its adapters is out of date

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.loading) + len(self.blocked)

    @property
    def adapter_loads(self) -> int:
        return self.slots.loads

    def adapters(self) -> frozenset[str]:
        """The adapters running or waiting here (vLLM's `vllm:lora_requests_info` labels)."""
        busy = {a for a, n in self.slots.users.items() if n}
        return frozenset(busy.union(r.adapter for r in self.blocked if r.adapter))

    def next_event_time(self) -> float | None:
        t = super().next_event_time()
        if self.down or not self.loading:
            return t
        ready = self.loading[0][0]
        return ready if t is None or ready < t else t

    def submit(self, req: EngineRequest, now: float) -> bool:
        if req.adapter is None:
            return super().submit(req, now)
        if self.down or not self.fits(req):
            return False
        req.submitted_at = now
        self.residency_changed = True
        if not self._place(req, now):
            self.blocked.append(req)
        return True

    def on_event(self, now: float) -> list[EngineRequest]:
        while self.loading and self.loading[0][0] <= now:
            self._enter(heapq.heappop(self.loading)[2], now)
        finished = super().on_event(now)
        released = False
        for req in finished:
            if req.adapter is not None:
                self.slots.release(req.adapter)
                released = True
        if released:
            self._unblock(now)
        return finished

    def abort(self, req: EngineRequest, now: float) -> bool:
        if req.adapter is None:
            return super().abort(req, now)
        self.residency_changed = True
        if req in self.blocked:
            self.blocked.remove(req)
            return True
        entry = next((e for e in self.loading if e[2] is req), None)
        if entry is not None:
            self.loading.remove(entry)
            heapq.heapify(self.loading)
        elif not super().abort(req, now):
            return False
        self.slots.release(req.adapter)
        self._unblock(now)
        return True

    def crash(self, now: float) -> list[EngineRequest]:
        lost = super().crash(now) + [e[2] for e in self.loading] + list(self.blocked)
        self.loading.clear()
        self.blocked.clear()
        self.slots.clear()
        self.residency_changed = True
        return lost

    def _place(self, req: EngineRequest, now: float) -> bool:
        """Take a slot for the request's adapter and queue it (now or when loaded)."""
        assert req.adapter is not None
        ready = self.slots.acquire(req.adapter, now)
        if ready is None:
            return False
        if ready <= now:
            self._enter(req, now)
        else:
            heapq.heappush(self.loading, (ready, req.rid, req))
        return True

    def _enter(self, req: EngineRequest, now: float) -> None:
        """Into the engine's own queue; its TTFT still counts from when it reached us."""
        submitted = req.submitted_at
        super().submit(req, now)
        req.submitted_at = submitted

    def _unblock(self, now: float) -> None:
        """Slots may have freed: the blocked requests, oldest first, take what they can."""
        if not self.blocked:
            return
        self.residency_changed = True
        still = deque(r for r in self.blocked if not self._place(r, now))
        self.blocked = still


def build_engines(
    params: list[EngineParams], lora: LoraSection | None, prefix_caching: bool
) -> list[EngineModel]:
    """The simulator's engines (reporting first tokens): with adapter slots when the
    scenario has a `[lora]` section."""
    options = {"prefix_caching": prefix_caching, "report_first_tokens": True}
    if lora is None:
        return [EngineModel(p, **options) for p in params]
    return [LoraEngine(p, lora, **options) for p in params]
