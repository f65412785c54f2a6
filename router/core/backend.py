"""Backends and the set the policies choose from.

A backend's own load (`in_flight`, `outstanding`) is booked by the OutstandingWork ledger;
its state only through BackendSet, which keeps the per-model candidate lists current."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

from gpuroute.router.core.slow_start import SlowStart


class BackendState(enum.Enum):
    READY = "ready"
    WARMING = "warming"  # slow start after join or un-ejection: capacity ramps up
    DRAINING = "draining"  # finishes what it has, gets nothing new
    EJECTED = "ejected"  # taken out by outlier detection or an open breaker
    STANDBY = "standby"  # warm, model loaded, out of rotation until brought in


ROUTABLE_STATES = frozenset({BackendState.READY, BackendState.WARMING})


class Backend:
    """One inference engine endpoint (one GPU, or one tensor-parallel group).

    `gpu_type` is its engine kind, what priors and learned corrections are kept by: the GPU
    type for one GPU running the router's default model shape, else e.g.
    `H200-tp4/llama-3.1-70b` (gpuroute/roofline.py EngineKind). `gpu` is the GPU type
    alone and `gpus` how many the engine spans (what it costs per hour)."""

    __slots__ = (
        "adapter_slots",
        "adapters",
        "address",
        "backend_id",
        "capacity",
        "external",
        "gpu",
        "gpu_type",
        "gpus",
        "in_flight",
        "lora_models",
        "models",
        "outstanding",
        "reason",
        "shared",
        "slowness",
        "state",
        "state_since",
        "zone",
    )

    def __init__(
        self,
        backend_id: str,
        gpu_type: str,
        models: Iterable[str],
        *,
        capacity: float = 1.0,
        address: str = "",
        zone: str | None = None,
        gpu: str | None = None,
        gpus: int = 1,
        lora_models: Iterable[str] = (),
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"backend {backend_id}: capacity must be > 0, got {capacity}")
        self.backend_id = backend_id
        self.gpu_type = gpu_type
        self.gpu = gpu or gpu_type
        self.gpus = gpus
        self.models = frozenset(models)
        self.capacity = capacity
        self.address = address
        self.zone = zone
        self.state = BackendState.READY
        self.state_since = 0.0
        self.reason = "configured"
        self.in_flight = 0
        self.outstanding = 0.0  # seconds of GPU work admitted and not yet finished
        self.external = 0.0  # work other routers put here, from the agent's load report
        self.shared = 0.0  # work other replicas of this router booked here (through Redis)
        self.slowness = 1.0  # observed / expected speed against the fleet (SlownessTracker)
        # LoRA adapters running or waiting there and its adapter slots (vLLM's
        # lora_requests_info: agent reports, or the simulator's engine); 0 slots: unknown
        self.adapters: frozenset[str] = frozenset()
        self.adapter_slots = 0
        self.lora_models = frozenset(lora_models)  # which of `models` are LoRA adapters

    @property
    def condition(self) -> str:
        """Its state and why, as operators read it ("ejected (breaker open)")."""
        return f"{self.state.value} ({self.reason})"

    @property
    def others_work(self) -> float:
        """Seconds of work other routers put here: the peers' exact shared ledger or the
        agent's report, whichever is larger (they describe the same requests)."""
        external, shared = self.external, self.shared
        return external if external > shared else shared

    def __repr__(self) -> str:
        return f"Backend({self.backend_id!r}, {self.gpu_type}, {self.state.value})"


class BackendSet:
    """All backends of a pool, with cached routable lists per model.

    `slow_start` turns a WARMING backend's nominal capacity into its effective capacity.
    """

    def __init__(self, backends: Iterable[Backend] = (), slow_start: SlowStart | None = None):
        self._by_id: dict[str, Backend] = {}
        self._routable: dict[str, list[Backend]] = {}
        self._models: frozenset[str] | None = None  # served by any backend, in any state
        self._adapters: frozenset[str] | None = None  # names any backend serves as adapters
        self.slow_start = slow_start or SlowStart()
        self.version = 0
        for backend in backends:
            self.add(backend)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self):
        return iter(self._by_id.values())

    def __contains__(self, backend_id: object) -> bool:
        return backend_id in self._by_id

    def get(self, backend_id: str) -> Backend:
        return self._by_id[backend_id]

    def add(self, backend: Backend, now: float = 0.0, *, warm: bool = False) -> None:
        """Add a backend; `warm=True` starts it in slow start (a join after startup)."""
        if backend.backend_id in self._by_id:
            raise ValueError(f"duplicate backend id {backend.backend_id!r}")
        self._by_id[backend.backend_id] = backend
        if warm and self.slow_start.window_s > 0:
            backend.state, backend.reason = BackendState.WARMING, "joined"
        backend.state_since = now
        self.changed()

    def remove(self, backend_id: str) -> Backend:
        backend = self._by_id.pop(backend_id)
        self.changed()
        return backend

    def set_state(self, backend: Backend, state: BackendState, now: float, reason: str) -> None:
        if backend.state is state and backend.reason == reason:
            return
        backend.state, backend.state_since, backend.reason = state, now, reason
        self.changed()

    def routable(self, model: str) -> Sequence[Backend]:
        """Backends in READY or WARMING that serve `model` (cached until the next change)."""
        cached = self._routable.get(model)
        if cached is None:
            cached = [
                b for b in self._by_id.values() if b.state in ROUTABLE_STATES and model in b.models
            ]
            self._routable[model] = cached
        return cached

    def serves(self, model: str) -> bool:
        """Whether any backend, in any state, serves `model` (404 vs 503 for the front;
        the union is kept until the next change, never a client's names)."""
        if self._models is None:
            self._models = frozenset().union(*(b.models for b in self._by_id.values()))
        return model in self._models

    def is_adapter(self, model: str) -> bool:
        """Whether some backend serves `model` as a LoRA adapter (kept until the next
        change, as `serves` is)."""
        if self._adapters is None:
            self._adapters = frozenset().union(*(b.lora_models for b in self._by_id.values()))
        return model in self._adapters

    def effective_capacity(self, backend: Backend, now: float) -> float:
        if backend.state is BackendState.WARMING:
            return backend.capacity * self.slow_start.factor(now - backend.state_since)
        return backend.capacity

    def finish_warmups(self, now: float) -> list[Backend]:
        """Move backends whose slow-start window has passed to READY."""
        done = [
            b
            for b in self._by_id.values()
            if b.state is BackendState.WARMING and self.slow_start.finished(now - b.state_since)
        ]
        for backend in done:
            self.set_state(backend, BackendState.READY, now, "warmed up")
        return done

    def changed(self) -> None:
        """A backend's models or state changed: the cached lookups are made again."""
        self._routable.clear()
        self._models = self._adapters = None
        self.version += 1
