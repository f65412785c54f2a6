"""The front stages of a request, in the order a client hears of them: who are you (401, 403),
is the body readable and valid (413, 400), is the model here (404, 503), is the tenant within
its quota (429), and a slot in the admission queue (429, 504). Each refuses with a Rejection;
nothing here has touched a backend."""

from __future__ import annotations

import itertools

from aiohttp import web
from gpuroute.router.admission_gate import AdmissionGate
from gpuroute.router.config import RouterConfig
from gpuroute.router.core.backend import BackendSet
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.forward import NO_BACKEND
from gpuroute.router.quotas import KeyPolicy
from gpuroute.router.request_parse import (
    PRIORITY_HEADER,
    ParsedRequest,
    RequestError,
    parse_request,
)
from gpuroute.router.residency_gate import ResidencyGate
from gpuroute.router.slo_gate import SloGate
from gpuroute.router.tenant_gate import TenantGate

from gpuroute.openai_api import Rejection, clip, read_body


class Front:
    def __init__(
        self,
        config: RouterConfig,
        backends: BackendSet,
        tenants: TenantGate,
        gate: AdmissionGate,
        residency: ResidencyGate,
        slo: SloGate,
        *,
        with_prefix_blocks: bool,
    ) -> None:
        self.config, self.backends = config, backends
        self.residency = residency
        self.slo = slo
        self.tenants, self.gate = tenants, gate
        # hashing every prompt's blocks is wasted work unless the policy reads them
        self.with_prefix_blocks = with_prefix_blocks
        self._ids = itertools.count(1)

    async def admit(
        self, request: web.Request, route: str, arrival: float
    ) -> tuple[ParsedRequest, bytes]:
        """The parsed request and its raw body, admitted; or a Rejection. Once admitted,
        `release(info)` must follow however the request ends. `arrival` starts its TTFT
        clock."""
        self.residency.check(request)
        key = self.tenants.identify(request)
        raw = await read_body(request, self.config.limits)
        parsed = self._parse(request, route, raw)
        info = parsed.info
        info.slo = self.slo.resolve(key, request.headers)
        info.arrived_at = arrival
        if not self.backends.serves(info.model):
            message = f"The model `{clip(info.model)}` does not exist."
            raise Rejection(404, message, param="model", code="model_not_found")
        if not self.backends.routable(info.model):
            raise Rejection(503, NO_BACKEND, code="no_backend")
        await self._charge_and_queue(key, info, parsed.deadline_s, request)
        return parsed, raw

    async def admit_other(self, request: web.Request) -> tuple[RequestInfo, bytes]:
        """An allow-listed passthrough request: key, body, quota and queue as above (its
        tokens estimated from the body's size, since its shape is not ours to parse)."""
        self.residency.check(request)
        key = self.tenants.identify(request)
        raw = await read_body(request, self.config.limits)
        priority = self.config.admission.default_priority
        info = RequestInfo(next(self._ids), "", max(1, len(raw) // 4), priority=priority)
        await self._charge_and_queue(key, info, None, request)
        return info, raw

    async def _charge_and_queue(
        self, key: KeyPolicy, info: RequestInfo, deadline_s: float | None, request: web.Request
    ) -> None:
        await self.tenants.charge(key, info, PRIORITY_HEADER in request.headers)
        try:
            await self.gate.admit(info, deadline_s)
        except BaseException:  # shed, or the client left while queued
            self.tenants.release(info)
            raise

    def release(self, info: RequestInfo) -> None:
        self.tenants.release(info)

    def _parse(self, request: web.Request, route: str, raw: bytes) -> ParsedRequest:
        admission = self.config.admission
        try:
            return parse_request(
                route,
                raw,
                request.headers,
                next(self._ids),
                priorities=tuple(admission.priorities),
                default_priority=admission.default_priority,
                with_prefix_blocks=self.with_prefix_blocks,
            )
        except RequestError as exc:
            raise Rejection(exc.status, exc.message, param=exc.param, code=exc.code) from None
