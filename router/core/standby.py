"""Warm standby (sans-IO): backends that are up with their model loaded but out of rotation
(`BackendState.STANDBY`, from the agent's `standby` in Consul, or a scaling pool's warm
pool in the simulator) come in the moment the SLO gate would otherwise hold a request,
before anything is refused, and go back out once their pool has been quiet for a while.

A flash crowd outruns any scale-out that boots machines (minutes for a GPU host and its
model); engines already warm take traffic within a routing decision. The attempts loop
asks `promote` when no backend is predicted to serve a request in time; the router's tick
asks `release`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from gpuroute.router.core.backend import Backend, BackendSet, BackendState

PROMOTED = "standby: brought in (requests would wait)"
RELEASED = "standby: back (pool quiet)"


class StandbyRotation:
    """Which standby backends this router brought in, and since when their pool is quiet."""

    def __init__(self, backends: BackendSet, release_after_s: float = 120.0) -> None:
        if release_after_s < 0:
            raise ValueError("release_after_s must be >= 0")
        self.backends, self.release_after_s = backends, release_after_s
        self._quiet_since: dict[str, float | None] = {}  # promoted id -> quiet since
        self.promotions = 0
        self.releases = 0
        # per pool (model) the backends came into or left: each of a backend's models counts
        self.promoted_into: Counter[str] = Counter()
        self.wanted: set[str] = set()  # models a promotion served since `take_wanted`
        self.released_from: Counter[str] = Counter()

    def waiting(self, model: str) -> list[Backend]:
        """Standby backends that could serve `model`, the most capable first."""
        found = [b for b in self.backends if b.state is BackendState.STANDBY and model in b.models]
        return sorted(found, key=lambda b: (-b.capacity, b.backend_id))

    def promote(self, model: str, now: float) -> Backend | None:
        """Bring one standby backend serving `model` into rotation (None: there is none)."""
        found = self.waiting(model)
        if not found:
            return None
        backend = found[0]
        self.backends.set_state(backend, BackendState.READY, now, PROMOTED)
        self._quiet_since[backend.backend_id] = None
        self.promotions += 1
        self.promoted_into.update(backend.models)
        self.wanted.add(model)
        return backend

    def take_wanted(self) -> set[str]:
        """The models that needed a standby backend since the last call: their pools are
        short, as surely as if a request had been held (the sizer grows them)."""
        wanted, self.wanted = self.wanted, set()
        return wanted

    def promoted(self) -> list[str]:
        return sorted(self._quiet_since)

    def release(self, now: float, quiet: Callable[[Backend], bool]) -> list[Backend]:
        """Send back to standby the backends this router brought in whose pool `quiet`
        says could do without them, once it has said so for `release_after_s`. Their
        streams finish where they are: standby takes no new requests, nothing is cut."""
        released = []
        for backend_id in list(self._quiet_since):
            backend = self._still_ours(backend_id)
            if backend is None:
                continue
            if not quiet(backend):
                self._quiet_since[backend_id] = None
                continue
            since = self._quiet_since[backend_id]
            if since is None:
                self._quiet_since[backend_id] = since = now
            if now - since >= self.release_after_s:
                self.backends.set_state(backend, BackendState.STANDBY, now, RELEASED)
                del self._quiet_since[backend_id]
                self.releases += 1
                self.released_from.update(backend.models)
                released.append(backend)
        return released

    def _still_ours(self, backend_id: str) -> Backend | None:
        """The promoted backend, if it is still in rotation on our say-so (the fleet may
        have activated it for good, ejected or removed it meanwhile)."""
        if backend_id in self.backends:
            backend = self.backends.get(backend_id)
            if backend.state is BackendState.READY and backend.reason == PROMOTED:
                return backend
        del self._quiet_since[backend_id]
        return None
