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
from gpuroute.router.request_parse import ParsedRequest, RequestError, parse_request
from gpuroute.router.tenant_gate import TenantGate

from gpuroute.openai_api import Rejection


class Front:
    def __init__(
        self,
        config: RouterConfig,
        backends: BackendSet,
        tenants: TenantGate,
        gate: AdmissionGate,
        *,
        with_prefix_blocks: bool,
    ) -> None:
        self.config, self.backends = config, backends
        self.tenants, self.gate = tenants, gate
        # hashing every prompt's blocks is wasted work unless the policy reads them
        self.with_prefix_blocks = with_prefix_blocks
        self._ids = itertools.count(1)

    async def admit(self, request: web.Request, route: str) -> tuple[ParsedRequest, bytes]:
        """The parsed request and its raw body, admitted; or a Rejection."""
        key = self.tenants.identify(request)
        raw = await self._read(request)
        parsed = self._parse(request, route, raw)
        info = parsed.info
        if not self.backends.serves(info.model):
            message = f"The model `{info.model}` does not exist."
            raise Rejection(404, message, param="model", code="model_not_found")
        if not self.backends.routable(info.model):
            message = f"no healthy backend can serve model `{info.model}` now"
            raise Rejection(503, message, code="no_backend")
        if key is not None:
            await self.tenants.charge(key, info, "x-gpuroute-priority" in request.headers)
        await self.gate.admit(info, parsed.deadline_s)
        return parsed, raw

    async def _read(self, request: web.Request) -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.limits.max_body_bytes
            raise Rejection(413, f"request body exceeds {limit} bytes") from None

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
