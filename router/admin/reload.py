"""Hot reload (`POST /admin/reload`, SIGHUP) and the static backends an operator changes at
run time (`POST /admin/backends`, drain, `DELETE`).

A reload reads the file again and applies what can change while requests are in flight:
the policy, static backends (new ones added warming, removed ones drained then dropped,
changed ones updated in place), keys and quotas, SLO classes' targets, and `[[models]]` aliases and
splits. A file that does not load (any ConfigError), or that changes a key only a restart
applies (`RESTART_KEYS`), is refused with its error and the running config stays: the file
is checked in full before anything is touched. Requests in flight keep their bookings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuroute.router.backends.assemble import configured_policy, static_backend
from gpuroute.router.backends.priors import PriorBook
from gpuroute.router.config.models import model_routes
from gpuroute.router.config.router import BackendConfig, RouterConfig, load_router_config
from gpuroute.router.core.backend import Backend, BackendState
from gpuroute.router.core.model_routes import ModelRouteError, ModelRoutes
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.front.admission import AdmissionGate
from gpuroute.router.front.slo import SloGate, slo_classes
from gpuroute.router.front.stages import Front
from gpuroute.router.observe.decision_log import DecisionLog
from gpuroute.router.scaling.autoscaler import Autoscaler

from gpuroute.config import ConfigError

log = logging.getLogger("gpuroute.router.admin.reload")
# what a reload applies; every other top-level key needs a restart (listeners, workers,
# Redis, TLS, the admin token, membership, limits, tracing, ...)
RELOADABLE = frozenset({"policy", "policy_settings", "backends", "auth", "slo", "models"})
# inside `slo`, what is baked into the scheduler's priors at start
SLO_RESTART = ("gpu_prices", "prior_scale", "max_tokens_is_output", "max_held")
DRAIN_POLL_S = 0.05
STATIC_FIELDS = ("gpu", "tensor_parallel", "pipeline_parallel")


def restart_keys(old: RouterConfig, new: RouterConfig) -> list[str]:
    """The keys whose change only a restart applies (empty: the file may be reloaded)."""
    changed = [
        name
        for name in type(old).model_fields
        if name not in RELOADABLE and getattr(old, name) != getattr(new, name)
    ]
    changed += [f"slo.{k}" for k in SLO_RESTART if getattr(old.slo, k) != getattr(new.slo, k)]
    if [c.name for c in old.slo.classes] != [c.name for c in new.slo.classes]:
        changed.append("slo.classes (their names; targets reload)")  # the hold queue's ranks
    return changed


@dataclass(slots=True)
class Roster:
    """Where each backend is and how many requests it takes at once: the forwarder's URLs
    and the admission gate's limits, kept in step as backends join and leave (discovered
    members, static backends a reload or the admin API adds or drops)."""

    urls: dict[str, str]
    gate: AdmissionGate

    def enter(self, backend_id: str, url: str, max_inflight: int) -> None:
        self.urls[backend_id] = url
        self.gate.set_limit(backend_id, max_inflight)

    def leave(self, backend_id: str) -> None:
        self.urls.pop(backend_id, None)
        self.gate.set_limit(backend_id, None)


@dataclass(slots=True)
class Running:
    """What the operator's side (reload, the admin API, the key store) reads and changes
    in a running router, and nothing more; router/http/server.py builds it with the parts."""

    config: RouterConfig  # the file in force: a reload replaces it
    scheduler: Scheduler
    book: PriorBook
    routes: ModelRoutes
    slo: SloGate
    autoscaler: Autoscaler
    decisions: DecisionLog
    front: Front  # reads the config and, for the policy, the prompt's prefix blocks
    roster: Roster
    clock: Callable[[], float]
    workers: int = 1
    port_given: bool = False  # a worker listens on the port its parent gave it


class Reloader:
    """Applies a new config to a running router; owns its static backends."""

    def __init__(
        self,
        router: Running,
        path: Path | str | None = None,
        on_keys: Callable[[], None] | None = None,
    ) -> None:
        self.router = router
        self.path = None if path is None else Path(path)
        self.static: dict[str, BackendConfig] = {b.backend_id: b for b in router.config.backends}
        self.draining: set[str] = set()
        self._drains: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()
        self.on_keys = on_keys  # called after keys were reloaded (the shared key store)

    async def reload(self) -> dict:
        """Read the file and apply it; ConfigError (the old config stays) when it is bad."""
        if self.path is None:
            raise ConfigError("this router was not started from a file: nothing to reload")
        async with self._lock:
            new = load_router_config(self.path)  # ConfigError names the file and the key
            return self.apply(new)

    def apply(self, new: RouterConfig) -> dict:
        r = self.router
        old = r.config
        if r.port_given:  # a worker listens on the port its parent gave it
            new = new.model_copy(
                update={"listen": new.listen.model_copy(update={"port": old.listen.port})}
            )
        if changed := restart_keys(old, new):
            raise ConfigError(f"{self.path}: {', '.join(changed)}: changes need a restart")
        routes = self._check(new)
        plan = self._plan(new.backends)  # ConfigError before anything changes
        self._apply_policy(new)
        self._apply_backends(new.backends, plan)
        r.routes.routes, r.routes.aliases = routes.routes, routes.aliases
        r.slo.classes = slo_classes(new.slo)
        r.autoscaler.follow_slo(new.slo)
        r.config = r.front.config = new
        if self.on_keys is not None:
            self.on_keys()
        log.info("config reloaded from %s: policy %s, %d static backends", self.path,
                 new.policy, len(new.backends))  # fmt: skip
        return {"reloaded": str(self.path), "policy": new.policy, "backends": sorted(self.static)}

    def _check(self, new: RouterConfig):
        try:
            return model_routes(new.models)
        except (ModelRouteError, ValueError) as exc:
            raise ConfigError(f"{self.path}: models: {exc}") from None

    def _plan(self, wanted: list[BackendConfig]) -> dict[str, Backend | None]:
        """Each wanted backend: a new Backend to add, or None (kept, updated in place)."""
        r, plan = self.router, {}
        for i, b in enumerate(wanted):
            old = self.static.get(b.backend_id)
            if old is None or b.backend_id in self.draining:
                if b.backend_id in r.scheduler.backends and b.backend_id not in self.static:
                    raise ConfigError(f"backends[{i}]: id {b.backend_id!r} is a discovered member")
                plan[b.backend_id] = static_backend(r.book, b, i)
                continue
            if moved := [f for f in STATIC_FIELDS if getattr(old, f) != getattr(b, f)]:
                raise ConfigError(
                    f"backends[{i}] ({b.backend_id}): {', '.join(moved)} cannot change in "
                    "place; give it a new id (the old one drains)"
                )
            plan[b.backend_id] = None
        return plan

    def _apply_policy(self, new: RouterConfig) -> None:
        r = self.router
        old = r.config
        if (new.policy, new.slo, new.policy_settings) != (old.policy, old.slo, old.policy_settings):
            r.scheduler.policy = configured_policy(new, r.book, r.workers)
            r.decisions.policy = new.policy
            r.front.with_prefix_blocks = "prefix_blocks" in r.scheduler.policy.needs

    def _apply_backends(self, wanted: list[BackendConfig], plan: dict[str, Backend | None]) -> None:
        for b in wanted:
            backend = plan[b.backend_id]
            if backend is not None:
                self.add(b, backend)
            else:
                self._update(b)
        for backend_id in [i for i in self.static if i not in plan]:
            self.drain(backend_id, remove=True)

    def add(self, b: BackendConfig, backend: Backend | None = None) -> None:
        """A static backend joins (slow start), replacing a draining one of the same id."""
        r = self.router
        backend = backend or static_backend(r.book, b, len(self.static))
        if b.backend_id in r.scheduler.backends:
            if b.backend_id not in self.draining:
                raise ConfigError(f"backend {b.backend_id!r} exists already")
            self._drop(b.backend_id)
        r.scheduler.backends.add(backend, r.clock(), warm=True)
        r.roster.enter(b.backend_id, b.url, b.max_inflight)
        self.static[b.backend_id] = b

    def _update(self, b: BackendConfig) -> None:
        r = self.router
        backend = r.scheduler.backends.get(b.backend_id)
        backend.address = b.url
        if b.capacity is not None:
            backend.capacity = b.capacity
        backend.models = frozenset(b.models)
        backend.lora_models = frozenset(b.lora_adapters)
        r.roster.enter(b.backend_id, b.url, b.max_inflight)
        r.scheduler.backends.changed()  # models may have changed: routable sets again
        self.static[b.backend_id] = b

    def drain(self, backend_id: str, *, remove: bool) -> None:
        """No new requests; those in flight finish. `remove`: dropped once idle."""
        r = self.router
        if backend_id not in self.static:
            raise KeyError(backend_id)
        backend = r.scheduler.backends.get(backend_id)
        reason = "removed" if remove else "drained by the operator"
        r.scheduler.backends.set_state(backend, BackendState.DRAINING, r.clock(), reason)
        if remove and backend_id not in self.draining:
            self.draining.add(backend_id)
            task = asyncio.get_running_loop().create_task(self._finish(backend_id))
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)

    def undrain(self, backend_id: str) -> None:
        """An operator's drain undone: back in rotation through slow start (or ejected, when
        its breaker or an ejection holds it out meanwhile). A backend being removed stays
        removed (KeyError: add it again); one not draining is left as it is."""
        r = self.router
        if backend_id not in self.static or backend_id in self.draining:
            raise KeyError(backend_id)
        backend = r.scheduler.backends.get(backend_id)
        if backend.state is not BackendState.DRAINING:
            return
        state, why = (
            (BackendState.EJECTED, "held out by its health")
            if r.scheduler.health.holds_out(backend_id)
            else (BackendState.WARMING, "undrained by the operator")
        )
        r.scheduler.backends.set_state(backend, state, r.clock(), why)

    async def _finish(self, backend_id: str) -> None:
        backends = self.router.scheduler.backends
        while backend_id in self.draining and backends.get(backend_id).in_flight > 0:
            await asyncio.sleep(DRAIN_POLL_S)
        if backend_id in self.draining:
            self._drop(backend_id)

    def _drop(self, backend_id: str) -> None:
        r = self.router
        self.draining.discard(backend_id)
        self.static.pop(backend_id, None)
        with contextlib.suppress(KeyError):
            r.scheduler.backends.remove(backend_id)
        r.roster.leave(backend_id)
        log.info("backend %s removed", backend_id)

    async def close(self) -> None:
        for task in list(self._drains):
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
