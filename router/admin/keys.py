"""API keys added and revoked through the admin API (`/admin/keys`), on top of the file's.

Keys are held by their sha256 only. With Redis configured they live there (a hash of
added keys, a set of revoked digests, a version counter bumped on every change), so every
replica sees them: each polls the version every `auth.key_sync_s` and reloads both when
it moved, which bounds how long a revoked key still works elsewhere. Without Redis they
are this process's (the parent of `--workers` tells every worker). A revocation outlives
reloads: a revoked digest is refused even while the file still lists it."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis
from gpuroute.router.admin.reload import Running
from gpuroute.router.config.auth import ApiKeyConfig, key_problem
from gpuroute.router.shared.quotas import Quotas
from gpuroute.router.shared.redis_client import REDIS_ERRORS

log = logging.getLogger("gpuroute.router.keys")
SYNC_ERRORS = (*REDIS_ERRORS, ValueError)


class KeyNotShared(Exception):
    """The change holds here but Redis did not take it: other replicas do not see it."""


class KeyStore:
    def __init__(self, router: Running, redis: aioredis.Redis | None, quotas: Quotas) -> None:
        self.router, self.redis = router, redis
        self.quotas = quotas  # the tenants' keys in force, which `apply` replaces
        prefix = router.config.redis.prefix
        self.added_key, self.revoked_key = f"{prefix}:admin:keys", f"{prefix}:admin:revoked"
        self.version_key = f"{prefix}:admin:keys:version"
        self.added: dict[str, ApiKeyConfig] = {}
        self.revoked: set[str] = set()
        self.version: int | None = None
        self.skipped: set[tuple[str, tuple[str, str]]] = set()  # (digest, problem) logged
        self._task: asyncio.Task | None = None

    def effective(self) -> list[ApiKeyConfig]:
        """The file's keys and the added ones (added win), less the revoked."""
        keys = {k.sha256: k for k in self.router.config.auth.keys} | self.added
        return [k for digest, k in keys.items() if digest not in self.revoked]

    def apply(self) -> None:
        """Put the effective keys in force, from the next request on."""
        r = self.router
        auth = r.config.auth.model_copy(update={"keys": self.effective()})
        built = Quotas.from_config(
            auth, r.config.redis, None, r.clock, lambda _shared: None, r.config.region,
            workers=r.workers,
        )  # fmt: skip
        quotas = self.quotas
        quotas.keys, quotas.anonymous = built.keys, built.anonymous
        # keys stay required once any was in use: revoking the last one closes the door
        # rather than opening it to keyless callers
        used = bool(r.config.auth.keys or self.added or self.revoked)
        quotas.required = built.required or (used and not auth.allow_anonymous)

    def describe(self) -> list[dict]:
        file_keys = {k.sha256 for k in self.router.config.auth.keys}
        rows = [
            {**k.model_dump(exclude_none=True), "source": "admin" if d in self.added else "file"}
            for d, k in ({k.sha256: k for k in self.router.config.auth.keys} | self.added).items()
            if d not in self.revoked
        ]
        revoked = [{"sha256": d, "revoked": True, "in_file": d in file_keys} for d in self.revoked]
        return rows + sorted(revoked, key=lambda row: row["sha256"])

    async def add(self, key: ApiKeyConfig) -> None:
        self.added[key.sha256] = key
        self.revoked.discard(key.sha256)
        self.apply()
        await self._share(lambda p: p.hset(self.added_key, key.sha256, key.model_dump_json())
                          .srem(self.revoked_key, key.sha256))  # fmt: skip

    async def revoke(self, digest: str) -> bool:
        """False when no such key is in force here."""
        known = any(k.sha256 == digest for k in self.effective())
        self.revoked.add(digest)
        self.added.pop(digest, None)
        self.apply()
        await self._share(lambda p: p.hdel(self.added_key, digest).sadd(self.revoked_key, digest))
        return known

    async def _share(self, change) -> None:
        if self.redis is None:
            return
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                change(pipe)
                pipe.incr(self.version_key)
                *_, self.version = await pipe.execute()
        except SYNC_ERRORS as exc:
            raise KeyNotShared(f"Redis did not take the change ({exc}); send it again") from None

    async def sync(self) -> bool:
        """Reload the shared keys if their version moved; True when it did."""
        assert self.redis is not None
        version = await self.redis.get(self.version_key)
        version = None if version is None else int(version)
        if version == self.version:
            return False
        added = await self.redis.hgetall(self.added_key)
        revoked = await self.redis.smembers(self.revoked_key)
        self.added = self._usable(added)
        self.revoked = {_text(d) for d in revoked}
        self.version = version
        self.apply()
        return True

    def _usable(self, added: dict) -> dict[str, ApiKeyConfig]:
        """The added keys from Redis that this router can use (`key_problem`: another
        replica, or an older config, may have taken one that names a class or priority
        unknown here). One that is not is skipped, and logged once, rather than failing the
        sync: a failed sync keeps the last set, so revocations would stop arriving."""
        usable: dict[str, ApiKeyConfig] = {}
        for digest, value in added.items():
            digest = _text(digest)
            try:
                key = ApiKeyConfig.model_validate_json(value)
                problem = key_problem(key, *self.router.config.key_context())
            except ValueError as exc:  # pydantic's ValidationError is one
                problem = ("sha256", f"unreadable ({str(exc).splitlines()[0]})")
            if problem is None:
                usable[digest] = key
            elif (digest, problem) not in self.skipped:
                self.skipped.add((digest, problem))
                field, why = problem
                log.warning("admin key %s... from Redis skipped: %s: %s", digest[:12], field, why)
        return usable

    async def start(self) -> None:
        """First sync before serving where Redis answers, then the poll loop."""
        if self.redis is None or self._task is not None:
            return
        with contextlib.suppress(*SYNC_ERRORS):
            await self.sync()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.router.config.auth.key_sync_s)  # a poll period
            try:
                await self.sync()
            except SYNC_ERRORS as exc:
                log.warning("admin keys not synced from Redis (%s); keeping the last", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def key_from_body(body: dict) -> ApiKeyConfig:
    """An added key from `{"sha256": ...}` or `{"key": "<the key itself>"}` plus its policy
    (tenant, quotas, ...); the key itself is hashed here and never kept."""
    from gpuroute.auth import key_digest

    body = dict(body)
    if "key" in body:
        body["sha256"] = key_digest(str(body.pop("key")))
    return ApiKeyConfig.model_validate(body)
