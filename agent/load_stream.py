"""The agent's gRPC load stream: every router watching gets each new sample as it is taken,
and the latest one again after `heartbeat_s` of silence so a quiet stream still proves it
is alive. `seq` grows only when the load changed, so routers can tell news from heartbeats.
With a load-stream token, a watcher must prove it holds it, and each report carries this
agent's proof for the watcher's nonce and its own service ID (gpuroute/load_auth.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import grpc

from gpuroute.grpc_server import start_grpc_server
from gpuroute.load_auth import report_proof, watch_refusal
from gpuroute.proto import load_pb2, load_pb2_grpc

log = logging.getLogger("gpuroute.agent.stream")


@dataclass(frozen=True, slots=True)
class LoadSample:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    gpu_util: float = 0.0
    memory_free_bytes: int = 0
    throttled: bool = False
    health: str = "warming"
    prefix_cache_hits: float = 0.0  # engine counters, carried as they are
    prefix_cache_queries: float = 0.0
    preemptions: float = 0.0
    lora_adapters: frozenset[str] = frozenset()  # running or waiting in the engine
    max_loras: int = 0  # its adapter slots (0: none, or unknown)

    def same_load(self, other: LoadSample) -> bool:
        """Equal up to noise that no router decision depends on."""
        return (
            self.running == other.running
            and self.waiting == other.waiting
            and abs(self.kv_cache_usage - other.kv_cache_usage) < 0.01
            and abs(self.gpu_util - other.gpu_util) < 0.05
            and self.throttled == other.throttled
            and self.health == other.health
            and self.preemptions == other.preemptions  # KV pressure: tell routers at once
            and self.lora_adapters == other.lora_adapters  # adapter affinity reads them
            and self.max_loras == other.max_loras
        )


class LoadBroadcaster:
    """Holds the latest sample; wakes every stream when a new one arrives."""

    def __init__(self, backend_id: str, clock) -> None:
        self.backend_id = backend_id
        self.clock = clock  # wall clock: the timestamp crosses machines
        self.seq = 0
        self.sample = LoadSample()
        self.taken_at = clock()
        self.version = 0  # every publish, heartbeat-worthy or not
        self._new = asyncio.Condition()
        self.watchers = 0

    async def publish(self, sample: LoadSample) -> None:
        if not sample.same_load(self.sample) or self.seq == 0:
            self.seq += 1
        self.sample, self.taken_at = sample, self.clock()
        self.version += 1
        async with self._new:
            self._new.notify_all()

    async def set_health(self, health: str) -> None:
        """A health change goes out at once, without waiting for the next sample."""
        await self.publish(replace(self.sample, health=health))

    def report(self, proof: bytes = b"") -> load_pb2.LoadReport:
        s = self.sample
        return load_pb2.LoadReport(
            backend_id=self.backend_id,
            seq=self.seq,
            timestamp=self.taken_at,
            running=s.running,
            waiting=s.waiting,
            kv_cache_usage=s.kv_cache_usage,
            gpu_util=s.gpu_util,
            memory_free_bytes=s.memory_free_bytes,
            throttled=s.throttled,
            health=s.health,
            prefix_cache_hits=s.prefix_cache_hits,
            prefix_cache_queries=s.prefix_cache_queries,
            preemptions=s.preemptions,
            lora_adapters=sorted(s.lora_adapters),
            max_loras=s.max_loras,
            proof=proof,
        )

    async def wait_newer(self, version: int, timeout: float) -> None:
        """Return when a sample newer than `version` exists, or after `timeout`."""
        async with self._new:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait_for(lambda: self.version > version), timeout)


class AgentLoadService(load_pb2_grpc.AgentLoadServicer):
    def __init__(
        self,
        broadcaster: LoadBroadcaster,
        heartbeat_s: float,
        token: str | None = None,
        clock: Callable[[], float] = time.time,  # wall clock, as the router's `sent_at`
    ) -> None:
        self.broadcaster = broadcaster
        self.heartbeat_s = heartbeat_s
        self.token = token
        self.clock = clock
        self.closing = asyncio.Event()

    async def WatchLoad(
        self, request: load_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[load_pb2.LoadReport]:
        b, proof = self.broadcaster, b""
        if self.token is not None:
            r = request
            why = watch_refusal(
                self.token, r.nonce, r.sent_at, r.router_id, r.router_proof, self.clock()
            )
            if why is not None:
                log.warning("load stream refused to %s: %s", context.peer(), why)
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"load stream: {why}")
            proof = report_proof(self.token, r.nonce, b.backend_id)
        b.watchers += 1
        log.info("router %s watching load", request.router_id or context.peer())
        try:
            while not self.closing.is_set():
                sent = b.version
                yield b.report(proof)
                await b.wait_newer(sent, self.heartbeat_s)
        finally:
            b.watchers -= 1


async def start_load_server(
    service: AgentLoadService,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    return await start_grpc_server(
        lambda server: load_pb2_grpc.add_AgentLoadServicer_to_server(service, server),
        host,
        port,
        "load stream",
        credentials,
    )
