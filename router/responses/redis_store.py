"""Stored responses in Redis, shared by every router replica.

Per tenant (its key part: a digest of its name):
- `{prefix}:responses:{tenant}:{id}`: the entry, expiring after the TTL;
- `{prefix}:responses:{tenant}`: a sorted set of its ids by when they were stored (Redis's
  clock), which says which is oldest;
- `{prefix}:responses-bytes:{tenant}`: each id's size, and the total under `#total` (no id
  has a `#`).
A put is one Lua script, atomic across replicas: it drops the tenant's expired ids, stores
the entry, then evicts the oldest while the tenant holds more than its bounds."""

from __future__ import annotations

import redis.asyncio as aioredis

# KEYS: the index, the sizes, the entry. ARGV: id, blob, ttl ms, max count, max bytes, the
# entries' key prefix. Returns how many entries it evicted.
DROP_LUA = """
local function drop(old)
  local size = tonumber(redis.call('HGET', KEYS[2], old) or '0')
  if size > 0 then
    redis.call('HDEL', KEYS[2], old)
    redis.call('HINCRBY', KEYS[2], '#total', 0 - size)
  end
  redis.call('ZREM', KEYS[1], old)
  return redis.call('DEL', ARGV[6] .. old)
end
"""
PUT_LUA = (
    DROP_LUA
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, blob, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_count, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl)) do drop(old) end
if redis.call('ZSCORE', KEYS[1], id) then drop(id) end
redis.call('SET', KEYS[3], blob, 'PX', ttl)
redis.call('ZADD', KEYS[1], now, id)
redis.call('HSET', KEYS[2], id, #blob)
local total = redis.call('HINCRBY', KEYS[2], '#total', #blob)
local evicted = 0
while redis.call('ZCARD', KEYS[1]) > max_count or total > max_bytes do
  drop(redis.call('ZRANGE', KEYS[1], 0, 0)[1])
  total = tonumber(redis.call('HGET', KEYS[2], '#total'))
  evicted = evicted + 1
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return evicted
"""
)
DELETE_LUA = DROP_LUA + "return drop(ARGV[1])\n"


class RedisResponses:
    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "gpuroute",
        ttl_s: float = 3600.0,
        max_count: int = 1000,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.redis = redis  # owned (and closed) by whoever built it
        self.prefix, self.ttl_ms = prefix, max(1, int(ttl_s * 1000))
        self.max_count, self.max_bytes = max_count, max_bytes
        self._put = redis.register_script(PUT_LUA)
        self._delete = redis.register_script(DELETE_LUA)

    def _keys(self, tenant: str, rid: str) -> tuple[list[str], str]:
        """The index, the sizes and the entry's key; and the entries' prefix."""
        entries = f"{self.prefix}:responses:{tenant}:"
        sizes = f"{self.prefix}:responses-bytes:{tenant}"
        return [f"{self.prefix}:responses:{tenant}", sizes, entries + rid], entries

    async def put(self, tenant: str, rid: str, blob: bytes) -> int:
        """Store; returns how many of the tenant's oldest entries it evicted."""
        keys, entries = self._keys(tenant, rid)
        args = [rid, blob, self.ttl_ms, self.max_count, self.max_bytes, entries]
        return int(await self._put(keys=keys, args=args))

    async def get(self, tenant: str, rid: str) -> bytes | None:
        keys, _ = self._keys(tenant, rid)
        return await self.redis.get(keys[2])

    async def delete(self, tenant: str, rid: str) -> bool:
        keys, entries = self._keys(tenant, rid)
        return bool(await self._delete(keys=keys, args=[rid, 0, 0, 0, 0, entries]))
