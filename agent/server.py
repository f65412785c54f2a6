"""The node agent process: sample the engine and GPUs, keep Consul told of health
transitions, stream load to routers, drain on SIGTERM or `gpuroute agent drain`.

Startup is warming (registered, critical) until the engine first answers /health; an engine
restart shows as critical and back; a Consul restart as a re-registration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

import aiohttp
from aiohttp import web
from gpuroute.agent.admin import AgentAdmin
from gpuroute.agent.amdsmi_source import open_gpu_source
from gpuroute.agent.config import AgentConfig, load_agent_config
from gpuroute.agent.core.engine_facts import EngineFacts
from gpuroute.agent.core.health import Health, HealthSettings, HostHealth, degraded_reason
from gpuroute.agent.engine_info import EngineInfo
from gpuroute.agent.engine_metrics import EngineLoad, parse_engine_metrics
from gpuroute.agent.gpu_telemetry import GpuReading, GpuSource
from gpuroute.agent.load_stream import (
    AgentLoadService,
    LoadBroadcaster,
    LoadSample,
    start_load_server,
)
from gpuroute.agent.metrics import AgentMetrics
from gpuroute.agent.registration import Registration

from gpuroute import runtime
from gpuroute.consul_client import ConsulClient, ConsulUnavailable
from gpuroute.grpc_server import server_credentials
from gpuroute.secrets import read_secret

log = logging.getLogger("gpuroute.agent")


class Agent:
    def __init__(self, config: AgentConfig, gpu_source: GpuSource | None = None) -> None:
        self.config = config
        t = config.telemetry
        self.health = HostHealth(
            HealthSettings(warning_hold_s=t.warning_hold_s, hot_temperature_c=t.hot_temperature_c)
        )
        simulated = config.engine.url + t.simulated_path
        self.gpu = gpu_source or open_gpu_source(
            t.source, simulated, config.engine.gpu, config.gpu_catalog(), t.gpu_indices
        )
        # secrets and certificates are read here, so a bad one fails start-up with its key
        self.stream_credentials = server_credentials(config.load_stream.tls, "load_stream.tls")
        self.consul_token = read_secret(config.consul, "token", "consul")
        self.admin_token = read_secret(config, "admin_token", "agent")
        self.broadcaster = LoadBroadcaster(config.service_id, time.time)
        self.stream = AgentLoadService(
            self.broadcaster,
            config.heartbeat_s,
            read_secret(config.load_stream, "token", "load_stream"),
        )
        self.engine_load = EngineLoad()
        self.engine_info = EngineInfo(config, self._on_engine_facts, healthy=lambda: self.engine_ok)
        self.gpu_reading = GpuReading()
        self.engine_ok = False
        self.registration: Registration | None = None
        self.consul: ConsulClient | None = None
        self.load_port = 0
        self.admin_port = 0
        self.done = asyncio.Event()  # set when a drain has finished
        self._drain_task: asyncio.Task | None = None
        self._exit_after_drain = False
        self._tasks: list[asyncio.Task] = []
        self._grpc = None
        self._admin: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.metrics = AgentMetrics()
        self.standby = config.standby  # warm, out of rotation (Meta standby) until activated
        self.metrics.standby.set(float(self.standby))

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        self._session = aiohttp.ClientSession()  # timeouts per call: engine.*_timeout_s
        self._grpc, self.load_port = await start_load_server(
            self.stream, c.load_stream.host, c.load_stream.port, self.stream_credentials
        )
        await self._start_admin()
        if c.consul.enabled:
            self.consul = ConsulClient(
                c.consul.address,
                token=self.consul_token,
                timeout_s=c.consul.timeout_s,
            )
            self.registration = Registration(
                c,
                self.consul,
                self.load_port,
                self._consul_status,
                lambda: self.engine_info.facts,
                self.engine_info.loaded,  # registered once the model has loaded
                standby=lambda: self.standby,
            )
            self._tasks.append(asyncio.create_task(self.registration.run()))
        self._tasks.append(asyncio.create_task(self._sample_loop()))
        self._tasks.append(asyncio.create_task(self.engine_info.run(self._session)))
        self._tasks.append(asyncio.create_task(self._health_loop()))
        log.info(
            "agent %s: engine %s, load stream :%d, admin :%d, GPU source %s",
            c.service_id,
            c.engine.url,
            self.load_port,
            self.admin_port,
            self.gpu.name,
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.stream.closing.set()
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        if self._admin is not None:
            await self._admin.cleanup()
        if self.consul is not None:
            await self.consul.close()
        if self._session is not None:
            await self._session.close()
        await self.gpu.close()

    def _consul_status(self) -> tuple[str, str]:
        return self.health.consul_status, self.health.consul_output

    def _on_engine_facts(self, _facts: EngineFacts) -> None:
        """New models, context length or degrees: register the new Meta (a draining host
        takes no new requests; undrain registers it)."""
        if self.registration is not None and self.health.state is not Health.DRAINING:
            self.registration.refresh()

    # -- sampling -----------------------------------------------------------------------------
    async def _health_loop(self) -> None:
        """Engine /health probes feed the health machine (slower than load samples)."""
        url = self.config.engine.url + self.config.engine.health_path
        while True:
            try:
                timeout = aiohttp.ClientTimeout(total=self.config.engine.health_timeout_s)
                async with self._session.get(url, timeout=timeout) as response:
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError, OSError):
                ok = False
            if ok and not self.engine_ok:  # started or restarted: what does it serve now?
                self.engine_info.poke()
            self.engine_ok = ok
            await self._observe()
            await asyncio.sleep(self.config.telemetry.health_interval_s)  # a period

    async def _observe(self) -> None:
        g = self.gpu_reading
        temps = [x.temperature_c for x in g.gpus if x.temperature_c is not None]
        reasons = tuple(sorted({r for x in g.gpus for r in x.throttle_reasons}))
        degraded = degraded_reason(
            g.throttled,
            reasons,
            max(temps, default=None),
            g.ecc_uncorrected,
            g.error,
            self.health.settings,
            g.row_remap_pending,
        )
        transition = self.health.observe(time.monotonic(), self.engine_ok, degraded)
        if transition is not None:
            await self._on_transition(transition.new, transition.reason)

    async def _on_transition(self, new: Health, reason: str) -> None:
        log.info("health -> %s (%s)", new.value, reason)
        self.metrics.transitions.labels(new.value).inc()
        for state in Health:
            self.metrics.health.labels(state.value).set(float(state is new))
        await self.broadcaster.set_health(new.value)
        if self.registration is not None:
            self.registration.changed.set()

    async def _sample_loop(self) -> None:
        engine = self.config.engine
        url = engine.url + engine.metrics_path
        while True:
            started = time.monotonic()
            metrics, self.gpu_reading = await asyncio.gather(self._scrape(url), self.gpu.read())
            if metrics is not None:
                self.engine_load = metrics
            g = self.gpu_reading
            await self.broadcaster.publish(
                LoadSample(
                    running=self.engine_load.running or 0,
                    waiting=self.engine_load.waiting or 0,
                    kv_cache_usage=self.engine_load.kv_cache_usage or 0.0,
                    gpu_util=g.util,
                    memory_free_bytes=g.memory_free,
                    throttled=g.throttled,
                    health=self.health.state.value,
                    prefix_cache_hits=self.engine_load.prefix_cache_hits or 0.0,
                    prefix_cache_queries=self.engine_load.prefix_cache_queries or 0.0,
                    preemptions=self.engine_load.preemptions or 0.0,
                    lora_adapters=self.engine_load.lora_adapters or frozenset(),
                    max_loras=self.engine_load.max_loras or 0,
                )
            )
            self.metrics.watchers.set(self.broadcaster.watchers)
            if self.registration is not None:
                self.metrics.consul_up.set(float(self.registration.consul_up))
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.config.telemetry.interval_s - elapsed))

    async def _scrape(self, url: str) -> EngineLoad | None:
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.engine.metrics_timeout_s)
            async with self._session.get(url, timeout=timeout) as response:
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}")
                text = await response.text()
            return parse_engine_metrics(text, self.config.engine.kind)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            self.metrics.scrape_errors.inc()
            return None

    # -- drain ----------------------------------------------------------------------------------
    def drain(self, exit_after: bool = True) -> asyncio.Task:
        """Start draining once; later calls return the same task. `exit_after` (SIGTERM):
        deregister and let the process end; else stay in maintenance until undrain."""
        finished_admin_drain = (
            self._drain_task is not None and self._drain_task.done() and not self._exit_after_drain
        )
        if self._drain_task is None or (exit_after and finished_admin_drain):
            # SIGTERM after an operator's drain has finished: drain again, this time to exit
            self._drain_task = asyncio.create_task(self._drain(exit_after))
        elif exit_after:
            self._exit_after_drain = True
        return self._drain_task

    async def undrain(self) -> dict:
        """Back into the fleet after an admin drain: out of maintenance, warming until the
        engine answers its health checks again."""
        if self._exit_after_drain:
            return {"undrained": False, "why": "the agent is shutting down"}
        if self._drain_task is not None:
            self._drain_task.cancel()
            self._drain_task = None
        transition = self.health.undrain()
        if transition is None:
            return {"undrained": False, "why": f"not draining ({self.health.state.value})"}
        await self._on_transition(transition.new, transition.reason)
        if self.registration is not None:
            try:
                await self.registration.maintenance("undrained", enable=False)
            except ConsulUnavailable as exc:
                log.warning("undrain: could not clear Consul maintenance (%s)", exc)
            self.registration.refresh()  # what the engine served may have changed meanwhile
        log.info("undrained: %s", self.health.state.value)
        return {"undrained": True, "health": self.health.state.value}

    def set_standby(self, on: bool) -> dict:
        """Stand by (`on`: warm, out of the routers' rotation, Meta `standby`), or be active
        again: registered again with the new Meta (a draining host registers on undrain)."""
        changed, self.standby = on != self.standby, on
        self.metrics.standby.set(float(on))
        if changed:
            log.info("standby -> %s", on)
            if self.registration is not None and self.health.state is not Health.DRAINING:
                self.registration.refresh()
        return {"standby": on, "changed": changed, "health": self.health.state.value}

    async def _drain(self, exit_after: bool) -> dict:
        self._exit_after_drain = exit_after
        c = self.config
        started = time.monotonic()
        transition = self.health.drain("drain requested")
        if transition is not None:
            await self._on_transition(transition.new, transition.reason)
        if self.registration is not None:
            try:
                await self.registration.maintenance("gpuroute agent draining")
            except ConsulUnavailable as exc:
                log.warning("drain: could not set Consul maintenance (%s)", exc)
        # requests a router sent just before it saw the drain may still be on the wire
        await asyncio.sleep(c.drain_grace_s)  # a grace period, not a synchronisation
        deadline = started + c.drain_timeout_s
        idle_samples = 0
        while time.monotonic() < deadline and idle_samples < 2:
            idle_samples = idle_samples + 1 if self.engine_load.in_flight == 0 else 0
            await asyncio.sleep(c.telemetry.interval_s)
        left = self.engine_load.in_flight
        if self.registration is not None and self._exit_after_drain:
            try:
                await self.registration.deregister()
            except ConsulUnavailable as exc:
                log.warning("drain: could not deregister (%s); Consul will reap it", exc)
        result = {
            "drained": left == 0,
            "in_flight_left": left,
            "seconds": round(time.monotonic() - started, 3),
        }
        log.info("drain finished: %s", result)
        if self._exit_after_drain:
            self.done.set()
        return result

    # -- admin ----------------------------------------------------------------------------------
    async def _start_admin(self) -> None:
        admin = AgentAdmin(
            self.admin_token,
            self.status,
            self.metrics.render,
            lambda: self.drain(exit_after=False),
            self.undrain,
            self.set_standby,
        )
        self._admin = web.AppRunner(admin.app(), access_log=None)
        await self._admin.setup()
        site = web.TCPSite(self._admin, self.config.admin.host, self.config.admin.port)
        await site.start()
        self.admin_port = self._admin.addresses[0][1]

    def status(self) -> dict:
        g, e, f = self.gpu_reading, self.engine_load, self.engine_info.facts
        r = self.registration
        return {
            "id": self.config.service_id,
            "health": self.health.state.value,
            "reason": self.health.reason,
            "standby": self.standby,
            "engine": {
                "ok": self.engine_ok,
                "running": e.running,
                "waiting": e.waiting,
                "kv_cache_usage": e.kv_cache_usage,
                "models": list(f.models),
                "adapters": list(f.adapters),
                "models_from_engine": f.learned,
                "max_model_len": f.max_model_len,
                "tensor_parallel": f.parallel.tp,
                "pipeline_parallel": f.parallel.pp,
                "data_parallel": f.parallel.dp,
            },
            "gpu": {
                "source": self.gpu.name,
                "count": len(g.gpus),
                "indices": [x.index for x in g.gpus],  # telemetry.gpu_indices, else all
                "util": round(g.util, 3),
                "memory_free_bytes": g.memory_free,
                "throttled": g.throttled,
                "error": g.error,
            },
            "consul": None
            if r is None
            else {"up": r.consul_up, "registered": r.registered, "writes": r.writes},
            "load_stream": {
                "port": self.load_port,
                "watchers": self.broadcaster.watchers,
                "seq": self.broadcaster.seq,
            },
        }


async def serve_agent(agent: Agent) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.drain)  # drain, then exit
    await agent.start()
    print(f"gpuroute agent {agent.config.service_id} admin on :{agent.admin_port}", flush=True)
    await agent.done.wait()
    await agent.stop()  # the admin runner's cleanup lets a pending /drain answer finish


def run_agent(path: str) -> int:
    return runtime.run_from_config(
        "agent", path, load_agent_config, lambda c: serve_agent(Agent(c)), fast_loop=False
    )
