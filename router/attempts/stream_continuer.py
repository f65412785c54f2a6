"""A stream whose engine broke mid-answer goes on on another backend (gpuroute/continuation/text.py
says what is sent and how it is spliced). The continuer only decides and writes: the verdict
on a break, the continuation's request, the splice, and the two endings that need no
backend (finished as its engine would have, or the explicit error event). Placing, sending
and relaying a continuation is one more attempt of the forwarder's attempt runner
(router/attempts/forward.py), which asks for the verdict and applies it: nothing here calls back."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from gpuroute.router.api.formats import stream_error_event
from gpuroute.router.attempts.exchange import Exchange
from gpuroute.router.observe.metrics import RouterMetrics

from gpuroute.continuation.relay import finish, give_up, keep, verdict_on
from gpuroute.continuation.splice import Splice
from gpuroute.continuation.text import (
    Broken,
    ContinuationConfig,
    continuation_body,
    prepare,
    sent_as,
)
from gpuroute.continuation.verdict import Verdict
from gpuroute.relay.body import Relayed, ResponseTally, is_event_stream
from gpuroute.upstream import UpstreamResponse

BROKEN_MESSAGE = "the backend failed mid-stream"
NOWHERE, BROKE = "no_backend", "engine_broke"  # why it ended with no backend; why continued


@dataclass(frozen=True, slots=True)
class Leg:
    """What an attempt carries: the request's first answer (`broken` None), or the
    continuation of its stream broken after `tries` continuations."""

    broken: Broken | None = None
    tries: int = 0
    body: dict | None = None  # the continuation's, its model set per placement


FIRST = Leg()


class StreamContinuer:
    """Continuations for one router: counted in its registry."""

    def __init__(self, config: ContinuationConfig, metrics: RouterMetrics) -> None:
        self.config = config  # counted in router/observe/metrics.py's
        self.counted, self.prefill = metrics.continuations, metrics.continuation_prefill

    def prepare(self, route: str, stream: bool, body: dict | None) -> tuple[bool, bool]:
        """Whether the stream may be continued, and whether its token ids were asked for on
        its client's behalf (gpuroute/continuation/text.py `prepare`)."""
        return prepare(self.config, route, stream, body)

    def record(self, exchange: Exchange, tally: ResponseTally) -> None:
        """Keep the stream's chunks while it may have to be continued."""
        if exchange.continuable:
            keep(self.config, tally)

    def verdict(self, exchange: Exchange, relayed: Relayed, tries: int) -> Verdict | None:
        """What becomes of its broken stream (None: a whole answer cut short, already
        closed)."""
        return verdict_on(self.config, exchange.route, exchange.body, relayed, tries)

    def leg(self, exchange: Exchange, broken: Broken, tries: int) -> tuple[Leg, int]:
        """The continuation of `broken`: its body and route set on the exchange, and the
        tokens its prompt holds beyond the last one's (what the booking lacks yet)."""
        life = exchange.life
        continued = life.continued_or_new(exchange.first_at or 0.0)
        before = 0 if continued.resumed_at is None else continued.delivered
        continued.continuations = tries
        body = continuation_body(exchange.body or {}, exchange.route, broken)
        exchange.continuation_route = sent_as(exchange.route, exchange.body or {}, broken)
        return Leg(broken, tries, body), broken.tokens - before

    @staticmethod
    def placed(exchange: Exchange, leg: Leg, model: str) -> None:
        """Its body for the model placed (a fallback's, if it came to that)."""
        assert leg.body is not None
        leg.body["model"] = model
        exchange.continuation = orjson.dumps(leg.body)

    def took(self, upstream: UpstreamResponse, prompt_tokens: int) -> bool:
        """Whether the continuation's engine answered with a stream (not: it refused it, a
        context too long, say); its prefill is done again there either way."""
        self.prefill.inc(prompt_tokens)
        return upstream.status < 400 and is_event_stream(upstream)

    def resumed(self, exchange: Exchange, now: float, broken: Broken) -> None:
        """The continuation's first bytes reached the client: its engine is judged on what
        follows."""
        continued = exchange.life.continued
        assert continued is not None
        continued.resumed_at, continued.delivered = now, broken.tokens

    @staticmethod
    def splice(exchange: Exchange, leg: Leg) -> Splice:
        """How the continuation's stream goes on in the client's, which never closed."""
        assert leg.broken is not None
        as_chat = exchange.continuation_route != exchange.route
        return Splice(leg.broken, as_chat=as_chat, body=exchange.body)

    async def finish(
        self, exchange: Exchange, relayed: Relayed, verdict: Verdict, write_timeout_s: float | None
    ) -> Relayed:
        """A stream that broke after its last token, ended as its engine would have."""
        assert verdict.reason is not None and exchange.response is not None
        self.counted.labels(verdict.reason, "ended").inc()
        return await finish(
            exchange.request, exchange.response, write_timeout_s, exchange.route,
            relayed.tally, verdict,
        )  # fmt: skip

    async def give_up(
        self,
        exchange: Exchange,
        relayed: Relayed,
        reason: str | None,
        write_timeout_s: float | None,
    ) -> Relayed:
        """The explicit error event ends it."""
        assert exchange.response is not None
        reason = reason or "unknown"
        self.counted.labels(reason, "ended").inc()
        await give_up(
            exchange.request, exchange.response, write_timeout_s, reason, BROKEN_MESSAGE,
            stream_error_event(exchange.route),
        )  # fmt: skip
        return relayed

    def went_on(self) -> None:
        self.counted.labels(BROKE, "continued").inc()
