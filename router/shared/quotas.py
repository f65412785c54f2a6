"""API keys and per-key quotas, shared by every router replica through Redis.

Keys are configured as sha256 hashes; `Authorization: Bearer <key>` is hashed and looked up.
Quotas (requests and tokens per minute) are token buckets kept in Redis and updated by one
Lua script, atomically across replicas, on Redis's own clock. A request's tokens are
charged at admission on an estimate and settled at its end against the engine's usage
(another script: the bucket may go into debt). When Redis cannot be reached
(down, restarting, slow beyond `timeout_s`), each replica enforces `local_fraction` of every
quota on its own buckets (same arithmetic, `router/core/token_bucket.py`), says so in
metrics, and tries Redis again after `retry_s`: a Redis outage never fails a request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
from gpuroute.router.config.auth import AuthConfig
from gpuroute.router.config.redis import RedisConfig
from gpuroute.router.config.router import RegionConfig
from gpuroute.router.core.token_bucket import Take, TokenBucket, per_minute
from gpuroute.router.shared.redis_client import REDIS_ERRORS

from gpuroute.auth import AuthError, client_key, key_digest

log = logging.getLogger("gpuroute.router.shared.quotas")
ANONYMOUS = "anonymous"  # the tenant keyless callers share

# Both scripts: KEYS[1] the bucket; ARGV rate per ms, burst, cost. The bucket refills on
# Redis's clock, then the script acts, then it is stored until it would be full again.
REFILL_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens, stamp = tonumber(state[1]), tonumber(state[2])
if tokens == nil then tokens, stamp = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
"""
STORE_LUA = """
redis.call('HSET', KEYS[1], 'tokens', tokens, 'stamp', math.max(now, stamp))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate) + 1000)
"""
# Take `cost` if it is there. Returns {allowed, tokens*1000, retry ms}.
TOKEN_BUCKET_LUA = (
    REFILL_LUA
    + """
local allowed, retry = 0, 0
if cost <= tokens then
  tokens = tokens - cost
  allowed = 1
else
  retry = math.ceil((cost - tokens) / rate)
end
"""
    + STORE_LUA
    + "return {allowed, math.floor(tokens * 1000), retry}\n"
)
# Correct after the fact: `cost` (used beyond the charge; negative gives back) is applied
# whatever is left, so a bucket may go into debt and refuse until it has refilled past it.
SETTLE_LUA = (
    REFILL_LUA
    + "tokens = math.min(burst, tokens - cost)\n"
    + STORE_LUA
    + "return math.floor(tokens * 1000)\n"
)


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    tenant: str
    priority: str | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    residency: frozenset[str] | None = None  # regions/jurisdictions it may be served in
    max_in_flight: int | None = None
    slo_class: str | None = None
    models: frozenset[str] | None = None  # what it may use (None: every model)
    allow_body_fields: frozenset[str] = frozenset()  # router-only fields it may send

    def may_be_served_in(self, place: frozenset[str]) -> bool:
        return self.residency is None or not self.residency.isdisjoint(place)


def _models(models: list[str] | None) -> frozenset[str] | None:
    return None if models is None else frozenset(models)


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    allowed: bool
    limit: str = ""  # "requests" or "tokens" when refused
    retry_after_s: float = 0.0
    headers: dict[str, str] | None = None
    shared: bool = True  # decided by Redis (False: the local fallback)


class Quotas:
    def __init__(
        self,
        keys: dict[str, KeyPolicy],
        *,
        required: bool,
        redis: aioredis.Redis | None,
        prefix: str = "gpuroute",
        timeout_s: float = 0.05,
        local_fraction: float = 1.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_mode: Callable[[bool], None] = lambda shared: None,
        place: frozenset[str] = frozenset(),
        anonymous: KeyPolicy | None = None,
    ) -> None:
        self.keys, self.required = keys, required
        self.anonymous = anonymous or KeyPolicy(ANONYMOUS)
        self.place = place  # this router's region name and jurisdiction
        self.prefix, self.timeout_s = prefix, timeout_s
        self.local_fraction, self.retry_s = local_fraction, retry_s
        self.clock, self.on_mode = clock, on_mode
        self.redis = redis  # owned (and closed) by whoever built it
        self._script = self.redis.register_script(TOKEN_BUCKET_LUA) if self.redis else None
        self._settle = self.redis.register_script(SETTLE_LUA) if self.redis else None
        self._local: dict[str, TokenBucket] = {}
        self._down_until = 0.0
        self.shared = self.redis is not None

    @classmethod
    def from_config(
        cls,
        auth: AuthConfig,
        redis: RedisConfig,
        client: aioredis.Redis | None,
        clock,
        on_mode: Callable[[bool], None],
        region: RegionConfig | None = None,
        workers: int = 1,
    ) -> Quotas:
        """`workers`: processes of one router, each enforcing its part of every local limit
        (in-flight caps, and the quota buckets when Redis does not hold them), so together
        they never allow more than the key's limit."""
        place = (region or RegionConfig()).place

        def part(cap: int | None) -> int | None:
            return None if cap is None else max(1, cap // workers)

        keys = {
            k.sha256: KeyPolicy(
                k.tenant, k.priority, k.requests_per_minute, k.tokens_per_minute,
                frozenset(k.residency) if k.residency is not None else None,
                part(k.max_in_flight),
                k.slo_class, _models(k.models), frozenset(k.allow_body_fields),
            )
            for k in auth.keys
        }  # fmt: skip
        a = auth.anonymous
        anonymous = KeyPolicy(
            ANONYMOUS, a.priority, a.requests_per_minute, a.tokens_per_minute,
            max_in_flight=part(a.max_in_flight), slo_class=a.slo_class,
            models=_models(a.models), allow_body_fields=frozenset(a.allow_body_fields),
        )  # fmt: skip
        return cls(
            keys, required=auth.keys_required, anonymous=anonymous, redis=client,
            prefix=redis.prefix,
            timeout_s=redis.timeout_s, local_fraction=redis.local_fraction / workers,
            retry_s=redis.retry_s, clock=clock, on_mode=on_mode, place=place,
        )  # fmt: skip

    def identify(self, headers: Mapping[str, str]) -> KeyPolicy:
        """The key's policy, or the anonymous one for a keyless caller where keys are not
        required; AuthError (401) for a missing, malformed or unknown key when keys are
        required or a key was sent, (403) for a key bound elsewhere."""
        key = client_key(headers)
        if key is None:
            if self.required:
                raise AuthError("missing API key: send `Authorization: Bearer <key>`")
            return self.anonymous
        policy = self.keys.get(key_digest(key))
        if policy is None:
            if self.required or self.keys:
                raise AuthError("invalid API key")
            return self.anonymous  # no keys in use: a key sent means nothing here
        if not policy.may_be_served_in(self.place):
            raise AuthError(
                f"tenant {policy.tenant} may only be served in "
                f"{', '.join(sorted(policy.residency or ()))}; this router is in "
                f"{', '.join(sorted(self.place))}",
                status=403,
                code="residency_violation",
                tenant=policy.tenant,
            )
        return policy

    async def charge(
        self, policy: KeyPolicy, tokens: int | None, *, request: bool = True
    ) -> QuotaVerdict:
        """Take one request (unless `request` is False: taken already) and `tokens` tokens
        from the tenant's buckets. `tokens=None` leaves the token bucket alone (a free
        route); `tokens=0` takes nothing but is refused while the bucket is in debt."""
        headers: dict[str, str] = {}
        shared = True
        for limit, per_min, cost in (
            ("requests", policy.requests_per_minute, 1 if request else None),
            ("tokens", policy.tokens_per_minute, tokens),
        ):
            if per_min is None or cost is None:
                continue
            take, shared = await self._take(f"{policy.tenant}:{limit}", per_min, cost)
            headers[f"x-ratelimit-limit-{limit}"] = str(int(per_min))
            headers[f"x-ratelimit-remaining-{limit}"] = str(max(0, int(take.remaining)))
            if not take.allowed:
                retry = take.retry_after_s
                if retry == float("inf"):
                    headers["Retry-After"] = "60"
                    return QuotaVerdict(False, limit, 60.0, headers, shared)
                headers["Retry-After"] = str(max(1, int(retry + 0.999)))
                headers[f"x-ratelimit-reset-{limit}"] = f"{retry:.3f}s"
                return QuotaVerdict(False, limit, retry, headers, shared)
        return QuotaVerdict(True, headers=headers, shared=shared)

    async def settle(self, policy: KeyPolicy, tokens: int) -> None:
        """Correct the tenant's token bucket by `tokens` used beyond its charge (negative:
        fewer used, given back), in the same place the charge went when Redis is up."""
        if policy.tokens_per_minute is None or not tokens:
            return
        bucket = f"{policy.tenant}:tokens"
        rate, burst = per_minute(policy.tokens_per_minute)
        now = self.clock()
        if self._settle is not None and now >= self._down_until:
            try:
                left_milli = await self._settle(
                    keys=[f"{self.prefix}:quota:{bucket}"], args=[rate / 1000.0, burst, tokens]
                )
                self._mirror(bucket, rate, burst, now, left_milli / 1000.0)
                return
            except REDIS_ERRORS as exc:
                self._down_until = now + self.retry_s
                log.warning("Redis unavailable (%s): quota settled locally", exc)
                self._mode(False)
        self._local_bucket(bucket, rate, burst, now).settle(now, tokens)

    def _mirror(self, bucket: str, rate: float, burst: float, now: float, left: float) -> None:
        """The local bucket follows what Redis said was left (its part of it), so a fallback
        starts where the shared bucket was, not full: an outage or a failover adds no burst."""
        self._local_bucket(bucket, rate, burst, now).follow(now, left * self.local_fraction)

    def _local_bucket(self, bucket: str, rate: float, burst: float, now: float) -> TokenBucket:
        local = self._local.get(bucket)
        if local is None:
            f = self.local_fraction
            local = self._local[bucket] = TokenBucket(rate * f, max(1.0, burst * f), now)
        return local

    async def _take(self, bucket: str, per_min: float, cost: float) -> tuple[Take, bool]:
        rate, burst = per_minute(per_min)
        now = self.clock()
        if self._script is not None and now >= self._down_until:
            try:
                allowed, tokens_milli, retry_ms = await self._script(
                    keys=[f"{self.prefix}:quota:{bucket}"], args=[rate / 1000.0, burst, cost]
                )
                self._mode(True)
                self._mirror(bucket, rate, burst, now, tokens_milli / 1000.0)
                return Take(bool(allowed), tokens_milli / 1000.0, retry_ms / 1000.0), True
            except REDIS_ERRORS as exc:
                self._down_until = now + self.retry_s
                log.warning(
                    "Redis unavailable (%s): local quota buckets for %.0f s", exc, self.retry_s
                )
                self._mode(False)
        return self._local_bucket(bucket, rate, burst, now).take(now, cost), False

    def _mode(self, shared: bool) -> None:
        if shared != self.shared:
            self.shared = shared
            log.info("quotas: %s", "shared through Redis" if shared else "local fallback")
            self.on_mode(shared)
