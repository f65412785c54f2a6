"""A request's attempts across the regions its decision allows, and the relay of the answer
that came. Failures before the first byte move on to the next region of the decision's
order (compliant regions only, by construction); a stream that breaks after it goes on in
another allowed region (global/stream_continuer.py), or ends with an SSE error event."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson
from aiohttp import web
from gpuroute.global_.access import ROUTER_REQUEST_ID
from gpuroute.global_.config import GlobalConfig
from gpuroute.global_.core.policy import GlobalDecision, GlobalPolicy, GlobalRequest
from gpuroute.global_.core.region_health import region_failed
from gpuroute.global_.core.residency import ANY
from gpuroute.global_.feeds import RegionFeeds
from gpuroute.global_.metrics import GlobalMetrics
from gpuroute.global_.stream_continuer import RegionStream

from gpuroute.auth import client_key
from gpuroute.continuation.relay import keep
from gpuroute.continuation.text import ContinuationConfig, prepare
from gpuroute.headers import router_headers
from gpuroute.openai_api import error_response
from gpuroute.relay.body import (
    RESPONSE_DROP,
    UPSTREAM_ERRORS,
    RelayedResponse,
    RelayEnd,
    ResponseTally,
    forward_headers,
    is_event_stream,
    relay_body,
)
from gpuroute.relay.strip import StrippingTally, usage_asked
from gpuroute.residency_decision import HEADER as DECISION_HEADER
from gpuroute.residency_decision import sign
from gpuroute.tracing import REQUEST_ID_HEADER, onward
from gpuroute.upstream import UpstreamPool, UpstreamResponse

log = logging.getLogger("gpuroute.global")
REGION_HEADER = "x-gpuroute-region"


@dataclass(slots=True)
class Forwarding:
    """One request on its way to regions: what was read of it, the decision, and the
    regions it was sent to."""

    request: web.Request
    read: Mapping[str, str]  # the headers as this tier interpreted them
    body: bytes
    parsed: dict | None  # the JSON body (None: an upload), what a continuation starts from
    asked: GlobalRequest  # what the decision was asked: its residency, client, hint
    decision: GlobalDecision
    headers: dict[str, str] = field(default_factory=dict)  # what every attempt sends
    tried: list[str] = field(default_factory=list)
    continuable: bool = False  # a stream that may go on in another region if its region breaks
    strip_token_ids: bool = False  # asked for to continue it exactly, not by the client
    strip_usage: bool = False  # a continuation asks for usage; this client did not

    @property
    def route(self) -> str:
        return self.request.path


class RegionAttempts:
    """Sends requests to regions' routers and relays their answers, for one global tier."""

    def __init__(
        self,
        session: UpstreamPool,
        feeds: RegionFeeds,
        policy: GlobalPolicy,
        metrics: GlobalMetrics,
        *,
        config: GlobalConfig,
        decision_key: bytes | None,
        rng: random.Random,
    ) -> None:
        self.session, self.feeds, self.policy, self.metrics = session, feeds, policy, metrics
        self.config, self.decision_key, self.rng = config, decision_key, rng
        self.continuation: ContinuationConfig = config.continuation

    async def forward(self, fwd: Forwarding) -> web.StreamResponse:
        """Forward to the decision's regions in order until one answers below 500 (only
        compliant regions are in the order, by construction). A router gets the headers it
        reads, never a caller's forwarding or decision headers: ours replace them."""
        request, order = fwd.request, fwd.decision.order
        fwd.headers = router_headers(request.headers.items(), fwd.read, request.remote)
        fwd.headers |= onward(request)
        self._prepare_continuation(fwd)
        last_error = "no attempt"
        for attempt, region in enumerate(order):
            if attempt:
                self.metrics.retries.labels(order[attempt - 1], region).inc()
            upstream = await self.send(fwd, region, fwd.body)
            if isinstance(upstream, str):
                last_error = upstream
                continue
            whole: bytes | None = None
            if not is_event_stream(upstream):  # one JSON document: read it all, so a region
                try:  # that dies before finishing it is just another failed attempt
                    whole = await upstream.read()
                except UPSTREAM_ERRORS as exc:
                    last_error = f"{region}: {type(exc).__name__} in the body"
                    upstream.release()
                    self.feeds.forwarded(region, False)
                    continue
            reason = fwd.decision.reason if attempt == 0 else "failover"
            self.metrics.requests.labels(region, reason).inc()
            if (router_id := upstream.headers.get(REQUEST_ID_HEADER)) is not None:
                request[ROUTER_REQUEST_ID] = router_id  # for the access line (global/access.py)
            if whole is not None:
                return self._whole(upstream, region, whole)
            return await self._relay(fwd, upstream, region)
        log.warning("every compliant region failed; last: %s", last_error)
        return error_response(502, "every compliant region failed to answer", code="upstream_error")

    async def send(
        self, fwd: Forwarding, region: str, body: bytes, target: str | None = None
    ) -> UpstreamResponse | str:
        """One attempt in `region` (to `target`, default the client's path), with a fresh
        residency decision (its own nonce): its answer below 500, else what failed (the
        region judged where it was its fault)."""
        base = self.feeds.feeds[region].url
        if base is None:
            return f"{region}: no router known"
        fwd.tried.append(region)
        if self.decision_key is not None:
            fwd.headers[DECISION_HEADER] = self._sign(fwd)
        try:
            target = target or fwd.request.path_qs
            upstream = await self.session.request("POST", base, target, body, fwd.headers)
        except UPSTREAM_ERRORS as exc:
            self.feeds.forwarded(region, False)
            return f"{region}: {type(exc).__name__}"
        if upstream.status >= 500:
            if region_failed(upstream.status, await self._refusal(upstream)):
                self.feeds.forwarded(region, False)
            upstream.release()
            return f"{region}: HTTP {upstream.status}"
        return upstream

    def _prepare_continuation(self, fwd: Forwarding) -> None:
        """A stream that may be continued asks its region for its token ids (the router
        passes vLLM's through), so a continuation elsewhere is token-exact; a continuation
        asks for usage, which a client that did not ask must not receive."""
        parsed = fwd.parsed
        stream = parsed is not None and parsed.get("stream") is True
        fwd.continuable, fwd.strip_token_ids = prepare(self.continuation, fwd.route, stream, parsed)
        if fwd.strip_token_ids:
            fwd.body = orjson.dumps(parsed)
        fwd.strip_usage = fwd.continuable and not usage_asked(parsed or {})

    def regions_left(self, fwd: Forwarding) -> tuple[str, ...]:
        """Where a broken stream may go on: the policy's ranking now, over the regions its
        residency allows, less those it was sent to."""
        decision = self.policy.decide(fwd.asked, self.feeds.views, self.rng)
        return tuple(r for r in decision.order if r not in fwd.tried)

    @staticmethod
    async def _refusal(upstream: UpstreamResponse) -> bytes:
        """A 503's body (a router's refusal says why; read within a second), else none."""
        if upstream.status != 503:
            return b""
        with contextlib.suppress(*UPSTREAM_ERRORS, TimeoutError):
            async with asyncio.timeout(1.0):
                return await upstream.read()
        return b""

    def _sign(self, fwd: Forwarding) -> str:
        """This request's decision, bound to its key (parsed already: it was valid)."""
        assert self.decision_key is not None
        jurisdictions = fwd.asked.allowed.jurisdictions
        places = None if jurisdictions is ANY else jurisdictions
        api_key = client_key(fwd.read)
        ttl = self.config.residency.decision_ttl_s
        return sign(places, self.decision_key, time.time(), api_key=api_key, ttl_s=ttl)

    def _whole(self, upstream: UpstreamResponse, region: str, body: bytes) -> web.Response:
        headers = forward_headers(upstream.headers.items(), RESPONSE_DROP)
        headers[REGION_HEADER] = region
        self.feeds.forwarded(region, True)
        upstream.release()
        return web.Response(status=upstream.status, body=body, headers=headers)

    async def _relay(
        self, fwd: Forwarding, upstream: UpstreamResponse, region: str
    ) -> web.StreamResponse:
        """The region's stream relayed; one that breaks after its first bytes goes on in
        another allowed region or ends with the error event (RegionStream)."""
        response = RelayedResponse(status=upstream.status)
        response.headers.update(forward_headers(upstream.headers.items(), RESPONSE_DROP))
        response.headers[REGION_HEADER] = region
        tally = ResponseTally(read_usage=False)  # the regions' routers settle usage, not this tier
        if fwd.continuable:  # held in whole events: a region's error event breaks it
            tally = StrippingTally(
                usage=fwd.strip_usage, token_ids=fwd.strip_token_ids, read_usage=False
            )
            keep(self.continuation, tally)
        try:
            relayed = await relay_body(
                fwd.request,
                response,
                upstream,
                broken_message=lambda exc: f"region {region} failed mid-stream",
                tally=tally,
                write_timeout_s=self.config.limits.client_write_timeout_s,
                end_broken=False,  # (a stream: whole answers were read) it may go on elsewhere
            )
        finally:
            upstream.release()
        if relayed.end is RelayEnd.UPSTREAM_BROKE:  # judged, continued or ended there
            stream = RegionStream(self, fwd, response, region)
            relayed, region = await stream.carry_on(relayed), stream.region
        if relayed.end is RelayEnd.CLIENT_TOO_SLOW:
            self.metrics.client_write_timeouts.inc()
        elif relayed.end is RelayEnd.COMPLETE:
            self.feeds.forwarded(region, True)
        return response
