"""Per-tenant usage records for billing: requests, errors and the engines' reported tokens
per (UTC hour, tenant, model), summed across replicas through Redis (router/core/usage.py
keeps the table).

With Redis, each replica counts in memory and every `usage.flush_interval_s` (and when it
shuts down) adds what it counted to `{prefix}:usage:{YYYYMMDDHH}` hashes, one field per
`["tenant","model","measure"]` (a JSON array: any tenant or model name is safe), expiring
`retention_days` after the hour ends. A flush is one Lua script that first sets a marker
for its batch, so a batch whose answer was lost is sent again without being counted twice;
while Redis is down the counts stay here (nothing is dropped unless Redis stays away longer
than the retention) and go with the next flush. Without Redis the table in memory is the
record, per replica. `GET /admin/usage` flushes this replica's counts, then sums."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping

import redis.asyncio as aioredis
from aiohttp import web
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.config.usage import UsageConfig
from gpuroute.router.core.usage import (
    MEASURES,
    Row,
    UsageHours,
    Window,
    hour_label,
    oldest_kept,
    parse_instant,
    usage_sums,
)
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.shared.redis_client import REDIS_ERRORS
from redis.exceptions import RedisError

from gpuroute.openai_api import error_response
from gpuroute.runtime import BackgroundLoop

log = logging.getLogger("gpuroute.router.usage")
BATCH_CELLS = 500  # cells per script call: Redis runs a script alone, keep each one short
MARKER_TTL_S = 86_400  # how long a batch's marker outlives it (a lost answer's retry window)
# KEYS[1]: the batch's marker; KEYS[2..n]: the hours' hashes. ARGV[1]: the marker's TTL;
# ARGV[2..n]: each hour's expiry (unix s); then (KEYS index, field, amount) triples.
FLUSH_LUA = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local n = #KEYS
for i = n + 1, #ARGV, 3 do
  redis.call('HINCRBY', KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
end
for i = 2, n do redis.call('EXPIREAT', KEYS[i], ARGV[i]) end
return 1
"""


def field(tenant: str, model: str, measure: str) -> str:
    return json.dumps([tenant, model, measure], ensure_ascii=False, separators=(",", ":"))


def parse_field(raw: bytes | str) -> tuple[str, str, str] | None:
    """A field's (tenant, model, measure); None for one this code did not write."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    ok = isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)
    return (value[0], value[1], value[2]) if ok and value[2] in MEASURES else None


class ReplicasBehind(RedisError):
    """Fewer replicas than `usage.replica_acks` acknowledged a flush in time."""


class BadQuery(ValueError):
    """A query parameter of `/admin/usage` that cannot be read: a 400 naming it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


def instant(query: Mapping[str, str], name: str, now: float, default: str | None = None) -> float:
    """The query's `since` or `until` as a unix time; BadQuery naming it."""
    text = query.get(name) or default
    if text is None:
        raise BadQuery(name, f"{name} is required: ISO 8601 (2026-11-26T10:00:00Z) or a time "
                       "ago (24h, 7d)")  # fmt: skip
    try:
        return parse_instant(text, now)
    except ValueError as exc:
        raise BadQuery(name, f"{name}: {exc}") from None


class UsageRecords:
    """One replica's usage recorder and its reading side (`/admin/usage`)."""

    def __init__(
        self,
        config: UsageConfig,
        redis: aioredis.Redis | None,
        metrics: RouterMetrics,
        *,
        prefix: str = "gpuroute",
        wall: Callable[[], float] = time.time,
        batch_cells: int = BATCH_CELLS,
        ack_wait_ms: int = 40,
    ) -> None:
        self.config, self.redis, self.metrics = config, redis, metrics
        self.ack_wait_ms = ack_wait_ms
        self.prefix, self.wall, self.batch_cells = prefix, wall, batch_cells
        self.retention_s = config.retention_days * 86_400
        self.counted = UsageHours()  # with Redis: not yet flushed; without: the record
        self.in_doubt: tuple[str, UsageHours] | None = None  # sent, answer not (yet) seen
        self._script = redis.register_script(FLUSH_LUA) if redis is not None else None
        self._lock = asyncio.Lock()
        self._loop = BackgroundLoop()  # the periodic flush
        self.failing = False
        metrics.usage_unflushed.set_function(lambda: self.unflushed)

    @classmethod
    def from_config(
        cls, config: RouterConfig, redis: aioredis.Redis | None, metrics: RouterMetrics
    ) -> UsageRecords:
        # WAIT answers within the call's own timeout, so a slow replica is a retry, not an error
        wait_ms = max(1, int(config.redis.timeout_s * 800))
        return cls(config.usage, redis, metrics, prefix=config.redis.prefix, ack_wait_ms=wait_ms)

    @property
    def shared(self) -> bool:
        return self._script is not None

    @property
    def unflushed(self) -> int:
        if not self.shared:
            return 0
        return len(self.counted) + (0 if self.in_doubt is None else len(self.in_doubt[1]))

    def record(self, tenant: str, model: str, prompt: int, completion: int, error: bool) -> None:
        """A request that got an answer (passthrough paths, which name no model, are not
        recorded). Only called where `usage.enabled` (the front holds none otherwise)."""
        if model:
            self.counted.record(self.wall(), tenant, model, prompt, completion, error)

    def key(self, hour: int) -> str:
        return f"{self.prefix}:usage:{hour_label(hour)}"

    def prune(self) -> None:
        """Hours past retention dropped; with Redis, counts that never reached it are lost
        then, and said so."""
        oldest = oldest_kept(self.wall(), self.retention_s)
        lost = self.counted.prune(oldest)
        if self.in_doubt is not None:
            lost += self.in_doubt[1].prune(oldest)
            if not self.in_doubt[1].hours:
                self.in_doubt = None
        if lost and self.shared:
            self.metrics.usage_dropped.inc(lost)
            log.error("usage records: %d cells older than retention dropped unflushed", lost)

    async def flush(self) -> None:
        """Everything counted here added to Redis, in batches; a Redis error is raised with
        the counts kept (the batch in doubt is sent again, under its marker, first)."""
        if self._script is None:
            self.prune()
            return
        async with self._lock:
            self.prune()  # (not while another flush sends the batch in doubt)
            while True:
                if self.in_doubt is None:
                    batch = self.counted.take(self.batch_cells)
                    if not batch.hours:
                        return
                    self.in_doubt = (secrets.token_hex(12), batch)
                await self._send(*self.in_doubt)
                self.in_doubt = None

    async def _send(self, batch_id: str, batch: UsageHours) -> None:
        assert self._script is not None
        hours = sorted(batch.hours)
        keys = [f"{self.prefix}:usage-batch:{batch_id}", *map(self.key, hours)]
        args: list[str | int] = [MARKER_TTL_S]
        args += [math.ceil((h + 1) * 3600 + self.retention_s) for h in hours]
        for index, hour in enumerate(hours, start=2):
            for (tenant, model), counts in batch.hours[hour].items():
                for measure, n in zip(MEASURES, counts, strict=True):
                    if n:
                        args += [index, field(tenant, model, measure), n]
        acks = self.config.replica_acks
        if not acks:
            await self._script(keys=keys, args=args)
            return
        assert self.redis is not None
        async with self.redis.pipeline(transaction=False) as pipe:  # WAIT: this connection's
            await self._script(keys=keys, args=args, client=pipe)
            pipe.wait(acks, self.ack_wait_ms)
            _, acked = await pipe.execute()
        if acked < acks:  # kept in doubt: a promoted replica may not have it
            raise ReplicasBehind(f"{acked} of {acks} replicas acknowledged the usage batch")

    async def flush_logged(self) -> bool:
        """A flush whose failure is counted and logged (once per outage); False then."""
        try:
            await self.flush()
        except REDIS_ERRORS as exc:
            self.metrics.usage_flush_failures.inc()
            if not self.failing:
                log.warning("usage records not flushed to Redis (%s); kept, retrying", exc)
            self.failing = True
            return False
        if self.failing:
            log.info("usage records flushed to Redis again")
        self.failing = False
        return True

    async def read(self, window: Window) -> list[Row]:
        """The rows of the window's hours: from Redis (this replica's counts flushed first),
        else from this replica's table."""
        if self.redis is None:
            return list(self.counted.rows(window.first, window.end))
        await self.flush()
        async with self.redis.pipeline(transaction=False) as pipe:
            for hour in window.hours():
                pipe.hgetall(self.key(hour))
            hashes = await pipe.execute()
        rows: list[Row] = []  # a row per field: usage_sums adds them up
        for raw, value in (item for fields in hashes for item in fields.items()):
            if (parsed := parse_field(raw)) is not None:
                tenant, model, measure = parsed
                counts = [0] * len(MEASURES)
                counts[MEASURES.index(measure)] = int(value)
                rows.append((tenant, model, counts))
        return rows

    async def start(self) -> None:
        self._loop.start(self._flushing())

    async def _flushing(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_interval_s)  # a period
            await self.flush_logged()

    async def close(self) -> None:
        """The loop stopped and a last flush (a drain, a shutdown): nothing counted here is
        left behind unless Redis is down."""
        await self._loop.stop()
        if not await self.flush_logged():
            log.error("usage records: %d cells not flushed at shutdown, lost", self.unflushed)

    # -- admin -----------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/usage", self.get)
        app.router.add_post("/admin/usage/flush", self.post_flush)

    async def get(self, request: web.Request) -> web.Response:
        """`?since=&until=&tenant=&model=`: per tenant and model, the sums over the window's
        hours (since rounded down to its hour, until up; until defaults to now)."""
        query, now = request.query, self.wall()
        try:
            since, until = instant(query, "since", now), instant(query, "until", now, "now")
            window = Window.of(since, until, now, self.retention_s)
        except BadQuery as exc:
            return error_response(400, exc.message, param=exc.param, code="invalid_usage_window")
        except ValueError as exc:  # the window itself
            return error_response(400, str(exc), param="until", code="invalid_usage_window")
        try:
            rows = await self.read(window)
        except REDIS_ERRORS as exc:
            message = f"usage records cannot be read from Redis ({exc})"
            return error_response(503, message, code="usage_unavailable")
        tenant, model = query.get("tenant"), query.get("model")
        body = {**window.echo(), "shared": self.shared, "tenant": tenant, "model": model}
        return web.json_response(body | usage_sums(rows, tenant, model))

    async def post_flush(self, _request: web.Request) -> web.Response:
        """This replica's counts into Redis now (the parent of `--workers` asks every worker
        before it reads)."""
        if not await self.flush_logged():
            message = "Redis did not take the usage records; they are kept here"
            return error_response(503, message, code="usage_unavailable")
        return web.json_response({"flushed": True, "shared": self.shared})
