"""The calls gpuroute makes to Consul, on py-consul's asyncio client (raw HTTP where it has no
call), each bounded by a timeout so a partitioned Consul can never hang a caller.

Consul's rules kept here (DESIGN.md): TTL updates go through PUT /v1/agent/check/update with
Status and Output; blocking-query indexes never go backwards and never below 1."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import consul
import consul.aio
import consul.callback
import consul.exceptions

SERVICE_META_MAX_PAIRS = 64
SERVICE_META_MAX_VALUE = 512


class ConsulUnavailable(Exception):
    """Consul did not answer in time or answered with an error."""


class ConsulRejected(ConsulUnavailable):
    """Consul answered but refused the request (bad request or ACL): not a transient error."""


class UnknownCheck(ConsulUnavailable):
    """The local agent no longer knows the check (it restarted or reaped the service)."""


def next_index(previous: int, returned: int) -> int:
    """The index for the next blocking query: reset when Consul's index went backwards
    (a snapshot restore or a new leader's state), and never below 1 (0 returns at once)."""
    if returned < previous:
        return 1
    return max(1, returned)


@dataclass(frozen=True, slots=True)
class ConsulAddress:
    host: str
    port: int
    scheme: str

    @classmethod
    def parse(cls, url: str) -> ConsulAddress:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        return cls(parts.hostname or "127.0.0.1", parts.port or 8500, parts.scheme or "http")


class ConsulClient:
    def __init__(
        self,
        address: str = "http://127.0.0.1:8500",
        *,
        token: str | None = None,
        datacenter: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.address = ConsulAddress.parse(address)
        self.token = token
        self.datacenter = datacenter
        self.timeout_s = timeout_s
        self._consul: consul.aio.Consul | None = None

    @property
    def api(self) -> consul.aio.Consul:
        # created lazily: py-consul's client opens an aiohttp session, which needs a loop
        if self._consul is None:
            a = self.address
            self._consul = consul.aio.Consul(
                host=a.host, port=a.port, scheme=a.scheme, token=self.token, dc=self.datacenter
            )
            # py-consul lets CONSUL_HTTP_TOKEN override the token passed in; a configured
            # token wins here, and the variable applies only where none is configured
            if self.token is not None:
                self._consul.token = self.token
        return self._consul

    async def close(self) -> None:
        if self._consul is not None:
            await self._consul.close()
            self._consul = None

    async def _call(self, awaitable, timeout_s: float | None = None) -> Any:
        try:
            return await asyncio.wait_for(awaitable, timeout_s or self.timeout_s)
        except consul.NotFound as exc:
            raise UnknownCheck(str(exc)) from exc
        except (consul.exceptions.BadRequest, consul.ACLPermissionDenied) as exc:
            raise ConsulRejected(f"Consul rejected the request: {exc}") from exc
        except (TimeoutError, OSError, consul.ConsulException) as exc:
            raise ConsulUnavailable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
        except Exception as exc:  # aiohttp errors and py-consul's ValueError on bad bodies
            if type(exc).__module__.startswith(("aiohttp", "consul")):
                raise ConsulUnavailable(f"{type(exc).__name__}: {exc}") from exc
            raise

    # -- agent side (the node agent's own registration) -------------------------------------
    async def register(self, service: dict[str, Any]) -> None:
        """Register (or replace) a service with its checks on the local Consul agent."""
        body = json.dumps(service)
        http = self.api.http
        await self._call(
            http.put(
                consul.callback.CB.boolean(),
                "/v1/agent/service/register",
                params=[("replace-existing-checks", "true")],
                data=body,
                headers=self.api.prepare_headers(),
            )
        )

    async def update_check(self, check_id: str, status: str, output: str) -> None:
        """Set a TTL check's status and output; UnknownCheck when the agent lost it."""
        http = self.api.http

        def callback(response):
            if response.code == 404 or (
                response.code == 500 and "Unknown check" in (response.body or "")
            ):
                raise consul.NotFound(response.body)
            if response.code != 200:
                raise consul.ConsulException(f"{response.code} {response.body}")
            return True

        body = json.dumps({"Status": status, "Output": output})
        await self._call(
            http.put(
                callback,
                f"/v1/agent/check/update/{check_id}",
                data=body,
                headers=self.api.prepare_headers(),
            )
        )

    async def maintenance(self, service_id: str, enable: bool, reason: str = "") -> None:
        await self._call(self.api.agent.service.maintenance(service_id, enable, reason or None))

    async def deregister(self, service_id: str) -> None:
        await self._call(self.api.agent.service.deregister(service_id))

    async def local_service_ids(self) -> set[str]:
        services = await self._call(self.api.agent.services())
        return set(services)

    # -- router side ------------------------------------------------------------------------
    async def health_service(
        self, name: str, index: int = 0, wait_s: float = 30.0, *, dc: str | None = None
    ) -> tuple[int, list[dict[str, Any]]]:
        """Blocking query on a service's health entries (all statuses: the caller filters)."""
        wait = f"{max(1, int(wait_s))}s"
        # Consul adds up to wait/16 of jitter to the wait; allow for it and a slow network
        budget = wait_s * (1 + 1 / 16) + self.timeout_s if index else self.timeout_s
        raw_index, entries = await self._call(
            self.api.health.service(name, index=index or None, wait=wait, dc=dc or self.datacenter),
            budget,
        )
        return int(raw_index or 0), entries or []

    async def datacenters(self) -> list[str]:
        return await self._call(self.api.catalog.datacenters())

    async def leader(self) -> str:
        return await self._call(self.api.status.leader())


def check_meta(meta: dict[str, str]) -> dict[str, str]:
    """Enforce Consul's service Meta limits before Consul rejects the registration."""
    if len(meta) > SERVICE_META_MAX_PAIRS:
        raise ValueError(f"service meta has {len(meta)} pairs; Consul allows 64")
    for key, value in meta.items():
        if (
            not key
            or len(key) > 128
            or key.startswith("consul-")
            or not all(c.isalnum() or c in "_-" for c in key)
        ):
            raise ValueError(f"service meta key {key!r} is not allowed by Consul")
        if len(value) > SERVICE_META_MAX_VALUE:
            raise ValueError(f"service meta {key!r} is {len(value)} chars; Consul allows 512")
    return meta
