"""A stream whose region broke mid-answer (its router died, or fell silent past
`limits.idle_timeout_s`) after the client's first bytes goes on in another region, as the
router continues one whose engine broke (gpuroute/continuation/relay.py: the same verdict,
loop, splice and endings). Residency first: only a region the request's rules allow, each
attempt with a fresh signed decision; none left, or a request that cannot be continued
faithfully, ends with the explicit error event."""

from __future__ import annotations

import logging
from typing import Protocol

import orjson
from aiohttp import web
from gpuroute.global_.config import GlobalConfig
from gpuroute.global_.feeds import RegionFeeds
from gpuroute.global_.metrics import GlobalMetrics
from gpuroute.global_.tracing_spans import continuation_event

from gpuroute.continuation.relay import BrokenStream, Refused
from gpuroute.continuation.splice import Splice
from gpuroute.continuation.text import Broken, ContinuationConfig, continuation_body, sent_as
from gpuroute.relay.body import Relayed, ResponseTally, is_event_stream
from gpuroute.upstream import UpstreamResponse

log = logging.getLogger("gpuroute.global.continuation")


class Forwarding(Protocol):
    """What a continuation reads of a request on its way to regions (its full form is
    global/region_attempts.py's Forwarding, which builds on this module)."""

    request: web.Request
    parsed: dict | None

    @property
    def route(self) -> str: ...


class RegionAttempts(Protocol):
    """What a continuation uses of the global tier's attempts (global/region_attempts.py)."""

    continuation: ContinuationConfig
    config: GlobalConfig
    metrics: GlobalMetrics
    feeds: RegionFeeds

    def regions_left(self, fwd: Forwarding, /) -> tuple[str, ...]: ...

    async def send(
        self, fwd: Forwarding, region: str, body: bytes, target: str | None = None, /
    ) -> UpstreamResponse | str: ...


class RegionStream(BrokenStream):
    """A stream whose region broke, continued in the next region the policy ranks now
    among those its residency allows (never one it was sent to already)."""

    NOWHERE, BROKE = "no_region", "region_broke"

    def __init__(
        self,
        attempts: RegionAttempts,
        fwd: Forwarding,
        response: web.StreamResponse,
        region: str,
    ) -> None:
        super().__init__(
            fwd.request,
            response,
            fwd.route,
            fwd.parsed,
            attempts.continuation,
            attempts.config.limits.client_write_timeout_s,
        )
        self.attempts, self.fwd, self.region = attempts, fwd, region

    def count(self, reason: str, outcome: str) -> None:
        self.attempts.metrics.continuations.labels(reason, outcome).inc()

    def message(self) -> str:
        return f"region {self.region} failed mid-stream"

    def broke(self, error: BaseException | None) -> None:
        """Its router died or fell silent: a failed forward, as one before the first byte."""
        self.attempts.feeds.forwarded(self.region, False)
        log.warning("stream from region %s broke after first byte: %r", self.region, error)

    async def attempt(self, tally: ResponseTally, broken: Broken, tries: int) -> Relayed | None:
        """The continuation sent to the allowed regions in turn until one answers with a
        stream, spliced into the client's (None: none would take it)."""
        attempts, fwd = self.attempts, self.fwd
        body = orjson.dumps(continuation_body(fwd.parsed or {}, fwd.route, broken))
        # a chat whose client asked for token ids may go on as a completion from them
        route = sent_as(fwd.route, fwd.parsed or {}, broken)
        target = None if route == fwd.route else route
        for region in attempts.regions_left(fwd):
            attempts.metrics.retries.labels(self.region, region).inc()
            upstream = await attempts.send(fwd, region, body, target)
            if isinstance(upstream, str):
                log.info("continuation %d not sent: %s", tries, upstream)
                continue
            if upstream.status >= 400 or not is_event_stream(upstream):
                upstream.close()  # a region that refuses it (a context too long, say)
                raise Refused(f"{region}: status {upstream.status}")
            self.region = region
            attempts.metrics.requests.labels(region, "continuation").inc()
            continuation_event(tries, broken.tokens, region)
            try:
                splice = Splice(broken, as_chat=target is not None, body=fwd.parsed)
                return await self.relay(upstream, tally, splice)
            finally:
                upstream.release()
        continuation_event(tries, broken.tokens, None)
        return None
