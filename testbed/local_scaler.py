"""The local executor of `gpuroute scale --local`: hosts on this machine, each a fake engine
and its real node agent (two processes; the agent registers in Consul), started and
stopped to follow the scaler's targets as an autoscaling group would
(router/core/scale_targets.py `follow_plan`, the simulator's rule too).

A pool short of its active size takes its standby hosts into service at once (the agent's
admin `/activate`), then boots new ones: each waits `boot_delay_s` (boot and model load,
simulated), then starts with `standby = false` while the pool needs active hosts, else as
standby. A pool over its size cancels boots, stops surplus standby at once, and drains
surplus active hosts, least busy first (the agent's admin `/drain`, which returns once the
engine is empty) before stopping them; an agent stopped by SIGTERM drains and deregisters,
so no request is lost. `max_hosts` bounds every host started and not yet stopped."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from gpuroute.router.core.scale_targets import PoolTarget, follow_plan
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, StartError, spawn, start_engine, wait_http

log = logging.getLogger("gpuroute.scale")
MODEL = "llama-3.1-8b"  # the fake engine's default shape
ADMIN = "127.0.0.1"


class Role(enum.Enum):
    BOOTING = "booting"
    ACTIVE = "active"
    STANDBY = "standby"
    LEAVING = "leaving"  # cancelled, draining or stopping: counts toward max_hosts only


@dataclass(frozen=True)
class LocalFleetSettings:
    consul: str  # the Consul agent the hosts' agents register with
    workdir: Path  # configs and logs
    models: tuple[str, ...] = (MODEL,)  # the pools it runs hosts for (served names)
    gpu: str = "L4"
    shape: str = MODEL  # the fake engine's model shape
    initial_hosts: int = 1  # active per pool at start, already booted
    boot_delay_s: float = 5.0
    max_hosts: int = 8
    time_scale: float = 1.0
    drain_timeout_s: float = 60.0
    follow_every_s: float = 0.5  # how often it checks its hosts against the targets


@dataclass(eq=False)
class LocalHost:
    pool: str
    index: int
    role: Role
    admin_port: int = 0
    engine: Child | None = None
    agent: Child | None = None
    joins_as: Role | None = None  # ACTIVE or STANDBY once booted, while its processes start
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def id(self) -> str:
        return f"local-{re.sub(r'[^A-Za-z0-9_.-]', '-', self.pool)}-{self.index}"

    @property
    def admin_url(self) -> str:
        return f"http://{ADMIN}:{self.admin_port}"


class LocalFleet:
    """An executor (router/scaling/scaler.py) running hosts on this machine."""

    name = "local"

    def __init__(self, settings: LocalFleetSettings, clock: Callable[[], float] = time.monotonic):
        self.settings, self.clock = settings, clock
        self.targets: dict[str, PoolTarget] = {}
        self.hosts: list[LocalHost] = []
        self.events: list[tuple[float, str, str]] = []  # (clock, host id, what happened)
        self.started = self.stopped = 0
        self._count = 0
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self._token = secrets.token_urlsafe(24)
        self._token_file = settings.workdir / "agents-admin-token"

    # -- the executor ------------------------------------------------------------------------
    async def start(self) -> None:
        """The initial hosts, running when this returns, then the follow loop."""
        self.settings.workdir.mkdir(parents=True, exist_ok=True)
        self._token_file.write_text(self._token + "\n")
        self._token_file.chmod(0o600)
        self._session = aiohttp.ClientSession()
        first = [self._new_host(pool) for pool in self.settings.models
                 for _ in range(self.settings.initial_hosts)]  # fmt: skip
        await asyncio.gather(*(self._run_host(h, standby=False) for h in first))
        if failed := [h.id for h in first if h.role is not Role.ACTIVE]:
            raise StartError(
                f"hosts {', '.join(failed)} did not start; logs in {self.settings.workdir}"
            )
        self._loop = asyncio.create_task(self._follow_loop())

    async def apply(self, targets: Mapping[str, PoolTarget]) -> None:
        unknown = sorted(set(targets) - set(self.settings.models))
        if unknown:
            log.info("local executor: no hosts for pools %s; left alone", ", ".join(unknown))
        self.targets = {p: t for p, t in targets.items() if p in self.settings.models}
        await self._follow()

    async def close(self) -> None:
        """Every host stopped (agents drain and deregister on SIGTERM)."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        async with self._lock:
            for host in self.hosts:
                host.cancelled.set()  # a booting host's own task stops it
                if host.role in (Role.ACTIVE, Role.STANDBY):
                    self._leave(host, "stopping: executor closing")
                    self._spawn(self._stop(host))
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def census(self, pool: str) -> dict[str, int]:
        """Hosts of `pool` by role (`leaving` still runs until stopped)."""
        counts = {role.value: 0 for role in Role}
        for host in self.hosts:
            if host.pool == pool:
                counts[host.role.value] += 1
        return counts

    # -- following the targets ---------------------------------------------------------------
    async def _follow_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.follow_every_s)  # a control loop's period
            try:
                await self._follow()
            except Exception:  # logged; the next period tries again
                log.exception("local executor: following the targets")

    async def _follow(self) -> None:
        async with self._lock:
            for pool, target in self.targets.items():
                await self._follow_pool(pool, target)

    async def _follow_pool(self, pool: str, target: PoolTarget) -> None:
        hosts = [h for h in self.hosts if h.pool == pool]
        active = [h for h in hosts if h.role is Role.ACTIVE]
        standby = [h for h in hosts if h.role is Role.STANDBY]
        booting = [h for h in hosts if h.role is Role.BOOTING]
        plan = follow_plan(len(active), len(standby), len(booting), target)
        for host in standby[: plan.activate]:
            self._spawn(self._turn(host, Role.ACTIVE, host.role))
            host.role = Role.ACTIVE
        ranked = await self._least_busy(active) if plan.to_standby or plan.drain else []
        for host in ranked[: plan.to_standby]:
            self._spawn(self._turn(host, Role.STANDBY, host.role))
            host.role = Role.STANDBY
        room = self.settings.max_hosts - len(self.hosts)
        if plan.boot > room:
            log.warning("local executor: %s wants %d more hosts, room for %d (max_hosts)",
                        pool, plan.boot, room)  # fmt: skip
        for _ in range(max(min(plan.boot, room), 0)):
            host = self._new_host(pool)
            self._event(host, "booting")
            self._spawn(self._boot(host))
        for host in booting[::-1][: plan.cancel]:  # the last to be ready first
            host.cancelled.set()
            self._leave(host, "boot cancelled")
        for host in standby[plan.activate :][::-1][: plan.stop_standby]:
            self._leave(host, "standby stopped")
            self._spawn(self._stop(host))
        for host in ranked[plan.to_standby :][: plan.drain]:
            self._leave(host, "draining")
            self._spawn(self._drain(host))

    def _new_host(self, pool: str) -> LocalHost:
        self._count += 1
        host = LocalHost(pool, self._count, Role.BOOTING)
        self.hosts.append(host)
        return host

    def _leave(self, host: LocalHost, what: str) -> None:
        host.role = Role.LEAVING
        self._event(host, what)

    def _event(self, host: LocalHost, what: str) -> None:
        self.events.append((self.clock(), host.id, what))
        log.info("local executor: %s %s", host.id, what)

    def _spawn(self, work) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one host's life ---------------------------------------------------------------------
    async def _boot(self, host: LocalHost) -> None:
        """Boot and model load (the delay), then its processes, as the pool needs it then."""
        with contextlib.suppress(TimeoutError):  # the delay passed: booted
            await asyncio.wait_for(host.cancelled.wait(), self.settings.boot_delay_s)
        if host.cancelled.is_set():
            self._forget(host)
            return
        target = self.targets.get(host.pool)
        active = sum(
            h.pool == host.pool and Role.ACTIVE in (h.role, h.joins_as) for h in self.hosts
        )
        standby = target is not None and active >= target.active
        host.joins_as = Role.STANDBY if standby else Role.ACTIVE  # counted by the next boot
        await self._run_host(host, standby=standby)
        if host.cancelled.is_set():  # cancelled while its processes started
            await self._stop(host)

    async def _run_host(self, host: LocalHost, *, standby: bool) -> None:
        try:
            await asyncio.to_thread(self._start_processes, host, standby)
        except Exception as exc:  # a host that would not start: gone, the pool boots again
            log.error("local executor: %s did not start: %s", host.id, exc)
            host.role = Role.LEAVING
            await self._stop(host)
            return
        if not host.cancelled.is_set():
            host.role = Role.STANDBY if standby else Role.ACTIVE
            self.started += 1
            self._event(host, "in standby" if standby else "in service")

    def _start_processes(self, host: LocalHost, standby: bool) -> None:
        """Its engine, then its agent, each answering when this returns (runs in a thread;
        each child is on `host` as soon as it exists, for `_stop`)."""
        s = self.settings
        served = None if host.pool == s.shape else host.pool
        engine = start_engine(
            s.workdir, host.index, s.gpu, time_scale=s.time_scale, stream_interval_ms=20.0,
            model=s.shape, served_name=served,
        )  # fmt: skip
        host.engine = engine
        wait_http(engine.url + "/health", 30, engine, f"{host.id}'s engine")
        host.admin_port = free_port()
        config = s.workdir / f"{host.id}.toml"
        config.write_text(self._agent_toml(host, engine.url, standby))
        cmd = [sys.executable, "-m", "gpuroute.cli", "agent", "--config", str(config)]
        host.agent = spawn(host.id, cmd, s.workdir, host.admin_port)
        wait_http(host.admin_url + "/healthz", 30, host.agent, f"{host.id}'s agent")

    def _agent_toml(self, host: LocalHost, engine_url: str, standby: bool) -> str:
        s = self.settings
        return (
            f'id = "{host.id}"\nstandby = {str(standby).lower()}\n'
            f"drain_grace_s = 0.5\ndrain_timeout_s = {s.drain_timeout_s}\n"
            f'admin_token_file = "{self._token_file}"\n'
            f'[engine]\nurl = "{engine_url}"\nmodels = ["{host.pool}"]\ngpu = "{s.gpu}"\n'
            '[telemetry]\nsource = "simulated"\ninterval_s = 0.2\nhealth_interval_s = 0.2\n'
            f'[consul]\naddress = "{s.consul}"\nttl_s = 6\n'
            f'[load_stream]\nport = 0\n[admin]\nhost = "{ADMIN}"\nport = {host.admin_port}\n'
        )

    async def _admin(self, host: LocalHost, action: str, timeout_s: float) -> dict:
        assert self._session is not None
        headers = {"Authorization": f"Bearer {self._token}"}
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.post(
            f"{host.admin_url}/{action}", json={}, headers=headers, timeout=timeout
        ) as response:
            answer = await response.json(content_type=None)
            if response.status != 200:
                raise aiohttp.ClientError(f"{action}: {response.status} {answer}")
            return answer

    async def _turn(self, host: LocalHost, role: Role, before: Role) -> None:
        """Into service (`activate`) or back to standby (`standby`: it finishes what it
        has), counted as `role` from now on; if the agent does not turn it, it is `before`
        again and the next follow tries again."""
        action = "activate" if role is Role.ACTIVE else "standby"
        try:
            await self._admin(host, action, 10)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.error("local executor: %s %s: %s; tried again", host.id, action, exc)
            if host.role is role:
                host.role = before
            return
        self._event(host, "activated" if role is Role.ACTIVE else "back to standby")

    async def _least_busy(self, hosts: list[LocalHost]) -> list[LocalHost]:
        async def busy(host: LocalHost) -> float:
            assert self._session is not None
            try:
                url = host.admin_url + "/status"
                async with self._session.get(url, timeout=aiohttp.ClientTimeout(2)) as r:
                    engine = (await r.json())["engine"]
                    return engine["running"] + engine["waiting"]
            except (aiohttp.ClientError, TimeoutError, OSError, KeyError, ValueError):
                return float("inf")  # unknown: drained last

        loads = await asyncio.gather(*(busy(h) for h in hosts))
        ranked = sorted(zip(loads, hosts, strict=True), key=lambda p: (p[0], -p[1].index))
        return [h for _, h in ranked]

    async def _drain(self, host: LocalHost) -> None:
        """The agent's drain (it answers once the engine is empty), then the stop."""
        wait = self.settings.drain_timeout_s + 30
        try:
            answer = await self._admin(host, "drain", wait)
            self._event(host, f"drained ({answer.get('seconds', '?')} s)")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.error("local executor: %s drain: %s; stopping it (SIGTERM drains)", host.id, exc)
        await self._stop(host)

    async def _stop(self, host: LocalHost) -> None:
        """SIGTERM: the agent drains what is left and deregisters; then the engine."""
        wait = self.settings.drain_timeout_s + 10
        for child in (host.agent, host.engine):
            if child is not None:
                await asyncio.to_thread(child.stop, wait)
        if self._forget(host) and host.agent is not None:
            self.stopped += 1
            self._event(host, "stopped")

    def _forget(self, host: LocalHost) -> bool:
        if host not in self.hosts:
            return False
        self.hosts.remove(host)
        return True
