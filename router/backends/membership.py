"""The router's I/O for a self-describing fleet: Consul blocking queries for membership and
health transitions, one gRPC load stream per agent for live load.

Consul down or unreachable: keep the last known set, say so in metrics and /admin/backends,
keep serving, and catch up by itself when Consul answers again. An agent's stream down:
its reports go stale and the router's own ledger alone decides for that backend.

A member Consul no longer lists leaves, whatever its stream says, except just after Consul
came back (`consul_restart_grace_s`). A stream whose reports name another backend, or lack
the agent's proof under `load_stream_token`, is cut (router/core/agent_load.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable, Iterable

import grpc
from gpuroute.router.config.router import MembershipConfig
from gpuroute.router.core.agent_load import (
    AgentLoadView,
    AgentReport,
    follow_adapters,
    report_refusal,
)
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.health import HealthEvents
from gpuroute.router.core.membership import (
    Member,
    apply,
    follow_agent,
    kept_by_agents,
    members_from_entries,
    plan,
    recovered,
    removable,
)
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.observe.metrics import RouterMetrics

from gpuroute.consul_client import ConsulClient, ConsulUnavailable, next_index
from gpuroute.grpc_server import channel_credentials, open_channel
from gpuroute.load_auth import NONCE_BYTES, report_proof, watch_proof
from gpuroute.proto import load_pb2, load_pb2_grpc
from gpuroute.runtime import cancel_within
from gpuroute.secrets import read_secret

log = logging.getLogger("gpuroute.router.backends.membership")
CLOSE_TIMEOUT_S = 5.0  # agent load streams, on shutdown
TYPICAL_PROMPT_TOKENS = 512  # prices another router's request when this one has none in flight
GRPC_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


class Membership:
    def __init__(
        self,
        config: MembershipConfig,
        scheduler: Scheduler,
        metrics: RouterMetrics,
        *,
        known_gpus: Iterable[str],
        capacity_of: Callable[[Member], float],
        kind_of: Callable[[Member], str] = lambda member: member.gpu,
        on_join: Callable[[Backend, Member], None],
        on_remove: Callable[[str], None],
        on_health: Callable[[HealthEvents], None],
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        router_id: str = "router",
    ) -> None:
        self.config = config
        self.stream_credentials = channel_credentials(
            config.load_stream_tls, "membership.load_stream_tls"
        )
        self.scheduler = scheduler
        self.metrics = metrics
        self.known_gpus = tuple(known_gpus)
        self.capacity_of = capacity_of
        self.kind_of = kind_of  # ValueError: the member's model does not fit its GPUs
        self.on_join, self.on_remove, self.on_health = on_join, on_remove, on_health
        self.clock = clock
        self.rng = rng or random.Random()
        self.router_id = router_id
        self.client = ConsulClient(
            config.consul or "",
            token=read_secret(config, "token", "membership"),
            datacenter=config.datacenter,
            timeout_s=config.timeout_s,
        )
        self.stream_token = read_secret(config, "load_stream_token", "membership")
        self.view = AgentLoadView(config.load_stale_s)
        self.members: dict[str, Member] = {}
        self.managed: set[str] = set()  # backend ids this module added (static ones are not)
        self.stale = True  # until the first answer
        self.synced = asyncio.Event()
        self.last_sync: float | None = None
        self.consul_back_at: float | None = None  # Consul answered after an outage or restart
        self._refused: dict[str, str] = {}  # backend id -> why its stream was last cut
        self._problems: set[str] = set()
        self._watch: asyncio.Task | None = None
        self._streams: dict[str, asyncio.Task] = {}

    async def start(self) -> None:
        self._watch = asyncio.create_task(self._watch_loop())

    async def close(self) -> None:
        tasks = [t for t in (self._watch, *self._streams.values()) if t is not None]
        await cancel_within(tasks, CLOSE_TIMEOUT_S, "agent load streams", log)
        await self.client.close()

    # -- Consul ---------------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        while True:
            try:
                await self._follow_consul()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not freeze membership: log, wait, go on
                log.exception("membership loop failed; restarting it")
                self._set_stale(True)
                await asyncio.sleep(1.0)

    async def _follow_consul(self) -> None:
        index, backoff = 0, 0.5
        while True:
            try:
                returned, entries = await self.client.health_service(
                    self.config.service, index, self.config.wait_s
                )
            except ConsulUnavailable as exc:
                if not self.stale:
                    log.warning(
                        "Consul unreachable (%s): keeping %d backends", exc, len(self.members)
                    )
                self._set_stale(True)
                index = 0  # a restarted Consul starts its indexes over
                await asyncio.sleep(backoff * (0.5 + self.rng.random()))  # jittered backoff
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            if self.stale or returned < index:  # reached again, or restarted (index reset)
                self.consul_back_at = self.clock()
            index = next_index(index, returned)
            members, problems = members_from_entries(entries, self.known_gpus)
            problems += self._without_kind(members)
            for problem in set(problems) - self._problems:
                log.warning("Consul entry ignored: %s", problem)
            self._problems = set(problems)
            back = recovered(self.members, members)
            self.members = members
            if self.stale:
                log.info("Consul answered: %d members", len(members))
            self._set_stale(False)
            self.last_sync = self.clock()
            self.reconcile(first=not self.synced.is_set())
            self._vouch(back)
            self.synced.set()
            # rate limit: a flapping service must not turn the loop into a busy poll
            await asyncio.sleep(self.config.min_interval_s * (0.5 + self.rng.random()))

    def _without_kind(self, members: dict[str, Member]) -> list[str]:
        """Drop the members whose engine kind has no priors (the model does not fit)."""
        problems = []
        for sid, member in list(members.items()):
            try:
                self.kind_of(member)
            except ValueError as exc:
                problems.append(f"{sid}: {exc}")
                del members[sid]
        return problems

    def _vouch(self, backend_ids: list[str]) -> None:
        """Checks passing again after critical: an open breaker probes now (its cooldown,
        doubled by probes that met the engine down, would hold a restarted engine out)."""
        backends, now = self.scheduler.backends, self.clock()
        for backend_id in backend_ids:
            if backend_id in backends:
                self.on_health(self.scheduler.health.vouched(backends.get(backend_id), now))

    def _set_stale(self, stale: bool) -> None:
        self.stale = stale
        self.metrics.membership_stale.set(float(stale))

    def reconcile(self, first: bool = False) -> None:
        """Bring the backend set in line with the last known members (also run every tick,
        so a backend's local state changes are checked against Consul's view)."""
        now, backends = self.clock(), self.scheduler.backends
        grace_s = self.config.consul_restart_grace_s
        vouched = kept_by_agents(self.vouched(), self.consul_back_at, now, grace_s)
        changes = plan(backends, self.managed, self.members, vouched)
        if changes:
            added = apply(
                backends, changes, self.members, now, capacity_of=self.capacity_of,
                warm=not first, kind_of=self.kind_of,
            )  # fmt: skip
            for backend in added:
                member = self.members[backend.backend_id]
                self.managed.add(backend.backend_id)
                self.on_join(backend, member)
                self._open_stream(backend.backend_id, member)
            for kind in ("joined", "down", "up", "left", "standby", "active"):
                if n := len(getattr(changes, kind)):
                    self.metrics.membership_changes.labels(kind).inc(n)
                    log.info("membership %s: %s", kind, _ids(getattr(changes, kind)))
        for sid in removable(backends, self.managed, self.members, vouched):
            backends.remove(sid)
            self.managed.discard(sid)
            self.view.forget(sid)
            self._refused.pop(sid, None)
            if task := self._streams.pop(sid, None):
                task.cancel()
            self.on_remove(sid)
            self.metrics.membership_changes.labels("removed").inc()

    def vouched(self) -> set[str]:
        """Backends whose agents stream fresh, healthy reports."""
        now = self.clock()
        return {sid for sid in self.managed if self.view.vouches(sid, now)}

    def verified(self, backend: Backend) -> bool:
        """Static backends, or discovered ones whose agent streams fresh, healthy reports
        (without load streams, Consul's word is all there is)."""
        if backend.backend_id not in self.managed or not self.config.load_streams:
            return True
        return self.view.vouches(backend.backend_id, self.clock())

    def lost(self, backend_id: str) -> bool:
        """Consul says critical or gone, and the agent is silent: a crashed or cut-off host,
        whose waiting requests will never be answered."""
        if backend_id not in self.managed:
            return False
        member = self.members.get(backend_id)
        consul_down = member is None or not member.routable
        return consul_down and self.view.fresh(backend_id, self.clock()) is None

    # -- agent load streams -------------------------------------------------------------------
    def _open_stream(self, backend_id: str, member: Member) -> None:
        if self.config.load_streams and member.load_address and backend_id not in self._streams:
            self._streams[backend_id] = asyncio.create_task(
                self._stream_loop(backend_id, member.load_address)
            )

    async def _stream_loop(self, backend_id: str, address: str) -> None:
        backoff = 0.25
        while True:
            request, expected = self._watch_request(backend_id)
            try:
                credentials = self.stream_credentials
                async with open_channel(address, credentials, GRPC_OPTIONS) as channel:
                    stub = load_pb2_grpc.AgentLoadStub(channel)
                    async for report in stub.WatchLoad(request):
                        why = report_refusal(backend_id, report.backend_id, report.proof, expected)
                        if why is not None:
                            self._cut(backend_id, address, why, repr(report.backend_id))
                            break
                        backoff = 0.25
                        self.on_report(backend_id, report)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                    self._cut(backend_id, address, "agent_refused", exc.details() or "")
                else:
                    log.debug("load stream %s (%s): %s", backend_id, address, exc.code())
            await asyncio.sleep(backoff * (0.5 + self.rng.random()))  # jittered reconnect
            backoff = min(backoff * 2, 5.0)

    def _watch_request(self, backend_id: str) -> tuple[load_pb2.WatchLoadRequest, bytes | None]:
        """A watch request (with a token: a fresh nonce and this router's proof) and the proof
        the agent of `backend_id` must put in each report (None: no token, none checked)."""
        if self.stream_token is None:
            return load_pb2.WatchLoadRequest(router_id=self.router_id), None
        nonce, sent_at = os.urandom(NONCE_BYTES), time.time()
        proof = watch_proof(self.stream_token, nonce, sent_at, self.router_id)
        request = load_pb2.WatchLoadRequest(
            router_id=self.router_id, nonce=nonce, sent_at=sent_at, router_proof=proof
        )
        return request, report_proof(self.stream_token, nonce, backend_id)

    def _cut(self, backend_id: str, address: str, why: str, detail: str) -> None:
        """A stream that cannot speak for its member: counted, and said once per cause."""
        self.metrics.load_streams_refused.labels(why).inc()
        if self._refused.get(backend_id) != why:
            self._refused[backend_id] = why
            log.warning(
                "load stream for %s at %s cut (%s: %s); its reports vouch for nothing",
                backend_id, address, why, detail,
            )  # fmt: skip

    def on_report(self, backend_id: str, r: load_pb2.LoadReport) -> None:
        if backend_id not in self.scheduler.backends:
            return
        self.metrics.load_report_age.observe(max(0.0, time.time() - r.timestamp))
        report = AgentReport(
            r.seq,
            r.timestamp,
            r.running,
            r.waiting,
            r.kv_cache_usage,
            r.gpu_util,
            r.throttled,
            r.health,
            self.clock(),
            r.prefix_cache_hits,
            r.prefix_cache_queries,
            r.preemptions,
            frozenset(r.lora_adapters),
            r.max_loras,
        )
        backend = self.scheduler.backends.get(backend_id)
        if self.view.record(backend_id, report):
            follow_agent(self.scheduler.backends, backend, report.health, report.received_at)
        if self.view.reports.get(backend_id) is report:  # the newest: its adapters hold
            follow_adapters(backend, report)
        backend.external = self.view.external_work(
            backend, report.received_at, self.mean_cost(backend)
        )

    def mean_cost(self, backend: Backend) -> float:
        if backend.in_flight:
            return backend.outstanding / backend.in_flight
        estimator = self.scheduler.estimator
        model = next(iter(backend.models))
        output = estimator.expected_output(model, None)
        return estimator.seconds(backend.gpu_type, backend.capacity, TYPICAL_PROMPT_TOKENS, output)

    def tick(self) -> None:
        self.reconcile()
        stale = self.view.update(
            (self.scheduler.backends.get(s) for s in self.managed if s in self.scheduler.backends),
            self.clock(),
            self.mean_cost,
        )
        self.metrics.agents_stale.set(stale)

    def describe(self, backend_id: str) -> dict | None:
        """The Consul and agent view of one backend, for /admin/backends."""
        if backend_id not in self.managed:
            return None
        member = self.members.get(backend_id)
        report = self.view.reports.get(backend_id)
        age = self.view.age(backend_id, time.time())
        return {
            "consul": None
            if member is None
            else {"status": member.status, "output": member.output},
            "agent": None
            if report is None
            else {
                "health": report.health,
                "running": report.running,
                "waiting": report.waiting,
                "kv_cache_usage": round(report.kv_cache_usage, 3),
                "gpu_util": round(report.gpu_util, 3),
                "throttled": report.throttled,
                "prefix_cache_hits": report.prefix_cache_hits,
                "prefix_cache_queries": report.prefix_cache_queries,
                "preemptions": report.preemptions,
                "seq": report.seq,
                "age_s": round(age, 3) if age is not None else None,
                "fresh": self.view.fresh(backend_id, self.clock()) is not None,
            },
            "external_s": round(self.scheduler.backends.get(backend_id).external, 4),
        }


def _ids(items) -> str:
    return ", ".join(m.backend_id if isinstance(m, Member) else m for m in items)
